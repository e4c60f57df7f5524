//! A workflow's picture as SVG, laid out by a real layout engine: Graphviz's `dot` when it is installed
//! (its SVG keeps the node and edge ids the run page colours), otherwise the `layout-rs` crate (a
//! static picture). Used by the run page and by `trellis graph --format svg`.

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;

use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

use crate::api::{ApiError, blocking};
use crate::runs::Server;

/// Which engine drew a picture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    Graphviz,
    LayoutRs,
}

/// Lays out `dot` (a workflow's [`trellis_workflow::graph_dot::picture`]) as SVG. Blocking.
pub fn render_svg(dot: &str) -> Result<(String, Engine), String> {
    match graphviz(dot) {
        Some(result) => result.map(|svg| (svg, Engine::Graphviz)),
        None => layout_rs(dot).map(|svg| (svg, Engine::LayoutRs)),
    }
}

/// Graphviz's answer, or `None` when `dot` is not installed.
fn graphviz(dot: &str) -> Option<Result<String, String>> {
    let mut child = match Command::new("dot")
        .arg("-Tsvg")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => return Some(Err(format!("cannot start Graphviz's dot: {e}"))),
    };
    let input = dot.to_owned();
    let mut stdin = child.stdin.take()?;
    // Written from a thread so a large picture cannot deadlock against dot's output.
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let output = match child.wait_with_output() {
        Ok(output) => output,
        Err(e) => return Some(Err(format!("Graphviz's dot failed: {e}"))),
    };
    let _ = writer.join();
    if !output.status.success() {
        return Some(Err(format!(
            "Graphviz's dot failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    Some(Ok(String::from_utf8_lossy(&output.stdout).into_owned()))
}

/// The shape `layout-rs` draws for a Graphviz shape: it knows boxes, circles and double circles
/// (anything else it draws as an ellipse), so start and exit become double circles, decisions
/// circles, and every stage a box.
fn layout_rs_shape(shape: &str) -> &'static str {
    match shape {
        "Mdiamond" | "Msquare" | "Mcircle" | "doublecircle" | "doubleoctagon" => "doublecircle",
        "diamond" | "circle" | "ellipse" | "oval" | "point" => "circle",
        _ => "box",
    }
}

/// `dot` with each `shape=NAME` replaced by what `layout-rs` can draw of it.
fn for_layout_rs(dot: &str) -> String {
    let mut out = String::with_capacity(dot.len());
    let mut rest = dot;
    while let Some(at) = rest.find("shape=") {
        let (before, after) = rest.split_at(at + "shape=".len());
        out.push_str(before);
        let quoted = after.starts_with('"');
        let name_start = usize::from(quoted);
        let name_end = after[name_start..]
            .find(|c: char| !c.is_ascii_alphanumeric())
            .map_or(after.len(), |n| n + name_start);
        out.push_str(layout_rs_shape(&after[name_start..name_end]));
        rest = &after[name_end + usize::from(quoted && after[name_end..].starts_with('"'))..];
    }
    out.push_str(rest);
    out
}

fn layout_rs(dot: &str) -> Result<String, String> {
    let dot = for_layout_rs(dot);
    // The crate panics on some inputs; a picture is never worth the process.
    std::panic::catch_unwind(move || {
        let mut parser = layout::gv::DotParser::new(&dot);
        let graph = parser
            .process()
            .map_err(|e| format!("cannot lay out the workflow: {e}"))?;
        let mut builder = layout::gv::GraphBuilder::new();
        builder.visit_graph(&graph);
        let mut visual = builder.get();
        let mut svg = layout::backends::svg::SVGWriter::new();
        visual.do_it(false, false, false, &mut svg);
        Ok(svg.finalize())
    })
    .unwrap_or_else(|_| Err("the layout engine failed on this workflow".to_owned()))
}

fn svg_response(svg: String, engine: Engine) -> Response {
    let mut response = svg.into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("image/svg+xml"),
    );
    headers.insert(
        "x-trellis-layout",
        HeaderValue::from_static(match engine {
            Engine::Graphviz => "graphviz",
            Engine::LayoutRs => "layout-rs",
        }),
    );
    response
}

/// The picture of a run's workflow (the source kept with the run).
#[utoipa::path(get, path = "/api/runs/{id}/graph.svg", params(("id" = String, Path, description = "The run id")),
    responses((status = 200, description = "`image/svg+xml`: nodes have ids `node:<id>`, edges `edge:<index>` (with Graphviz)"),
        (status = 404, description = "No such run")))]
pub async fn run_graph(
    State(server): State<Arc<Server>>,
    UrlPath(id): UrlPath<String>,
) -> Result<Response, ApiError> {
    let (source, meta) = blocking(move || {
        let record = server.record(&id)?;
        let meta = record.meta().map_err(ApiError::internal)?;
        let source = record
            .source_file()
            .ok_or_else(|| ApiError::not_found("the run has no workflow source"))?;
        Ok((source, meta))
    })
    .await?;
    let loaded = trellis_run::load(
        &source,
        std::path::Path::new(&meta.source_path),
        trellis_run::recorded_options(&meta),
    )
    .await?;
    let Some(workflow) = loaded.compiled.workflow else {
        return Err(ApiError::Status(
            axum::http::StatusCode::UNPROCESSABLE_ENTITY,
            "the workflow saved with the run no longer compiles".into(),
        ));
    };
    let dot = trellis_workflow::graph_dot::picture(&workflow);
    let (svg, engine) = blocking(move || render_svg(&dot).map_err(ApiError::internal)).await?;
    Ok(svg_response(svg, engine))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_layout_gets_shapes_it_can_draw() {
        let dot = "digraph W {\n  node [shape=box]\n  s [shape=Mdiamond]\n  b [label=\"x\", shape=parallelogram]\n  d [shape=\"diamond\"]\n}\n";
        assert_eq!(
            for_layout_rs(dot),
            "digraph W {\n  node [shape=box]\n  s [shape=doublecircle]\n  b [label=\"x\", shape=box]\n  d [shape=circle]\n}\n"
        );
        let (svg, engine) = (layout_rs(dot).unwrap(), Engine::LayoutRs);
        assert_eq!(engine, Engine::LayoutRs);
        assert!(svg.contains("<rect") || svg.contains("<path"), "{svg}");
    }
}
