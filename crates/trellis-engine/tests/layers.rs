//! The engine's modules form layers a reader can follow bottom up: data, below the seams to the
//! outside world, below the engine's core, below the drivers that walk a workflow. A module may use
//! the modules of lower layers and those listed before it in its own layer, never one above: this
//! test reads every module's `crate::` paths (its tests aside) and fails on an arrow back up.

#![allow(
    clippy::disallowed_methods,
    reason = "the test reads the crate's own sources"
)]

use std::collections::BTreeSet;
use std::path::Path;

/// Bottom up. Within a layer, a module may use the ones listed before it.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "data",
        &[
            "keys",
            "text",
            "details",
            "settings",
            "blob",
            "outcome",
            "context",
            "route_view",
            "checkpoint",
            "event",
            "status_file",
            "join",
        ],
    ),
    ("seams", &["services", "hooks", "handler"]),
    (
        "record and built-in handlers",
        &["record", "control", "routing"],
    ),
    ("core", &["engine"]),
    ("drivers", &["attempt", "step", "parallel", "sub_workflow"]),
];

fn position(module: &str) -> Option<(usize, usize)> {
    LAYERS.iter().enumerate().find_map(|(layer, (_, modules))| {
        modules
            .iter()
            .position(|m| *m == module)
            .map(|index| (layer, index))
    })
}

/// The modules `source` names as `crate::module`, before its tests.
fn uses(source: &str) -> BTreeSet<String> {
    let code = source.split("#[cfg(test)]").next().unwrap_or(source);
    let mut found = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        let name: String = code[at + "crate::".len()..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '_')
            .collect();
        if !name.is_empty() {
            found.insert(name);
        }
    }
    found
}

#[test]
fn no_module_uses_one_above_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut problems = Vec::new();
    let mut seen = 0;
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let module = path.file_stem().unwrap().to_str().unwrap().to_owned();
        if module == "lib" {
            continue;
        }
        seen += 1;
        let Some(here) = position(&module) else {
            problems.push(format!("`{module}` is in no layer: add it to LAYERS"));
            continue;
        };
        let source = std::fs::read_to_string(&path).unwrap();
        for used in uses(&source) {
            if used == module {
                continue;
            }
            match position(&used) {
                Some(there) if there < here => {}
                Some(_) => problems.push(format!(
                    "`{module}` ({}) uses `{used}` ({}), which is not below it",
                    LAYERS[here.0].0,
                    LAYERS[position(&used).unwrap().0].0
                )),
                None => problems.push(format!("`{module}` uses `{used}`, in no layer")),
            }
        }
    }
    let listed: usize = LAYERS.iter().map(|(_, m)| m.len()).sum();
    assert_eq!(seen, listed, "LAYERS lists modules that are gone");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_reader_finds_what_a_module_uses() {
    let source = "use crate::keys;\nfn f() { crate::event::x(); }\n#[cfg(test)]\nmod tests { use crate::engine; }";
    assert_eq!(
        uses(source),
        BTreeSet::from(["event".to_owned(), "keys".to_owned()])
    );
}
