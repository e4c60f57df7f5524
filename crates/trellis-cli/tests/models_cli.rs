//! `trellis models`: configured providers without their keys, the local model's state, the default
//! model, the catalog, and a clear way out when nothing is available.

mod run_support;

use run_support::Project;
use serde_json::Value;

#[test]
fn without_any_model_it_says_how_to_set_one_up() {
    let p = Project::new();
    let out = p.command(&["models"]).output().unwrap();
    // A report, not a failure.
    assert_eq!(out.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("anthropic          not configured (set ANTHROPIC_API_KEY)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("llama-server       missing: no server at"),
        "{stdout}"
    );
    assert!(
        stdout.contains("No model is available yet: run `scripts/local-model.sh`"),
        "{stdout}"
    );
    let json = p.command(&["models", "--json"]).output().unwrap();
    assert_eq!(json.status.code(), Some(0));
    let report: Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(report["usable"], false);
}

#[test]
fn configured_providers_are_listed_without_their_keys() {
    let p = Project::new().with_env("ANTHROPIC_API_KEY", "sk-ant-very-secret-0001");
    p.write(".config/trellis/config.toml", "[providers.gemini]\napi_key = \"gm-secret-0002\"\nbase_url = \"http://127.0.0.1:9/gemini\"\n");
    let out = p.command(&["models", "--catalog"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("anthropic          configured (default address)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("gemini             configured (http://127.0.0.1:9/gemini)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("Default model: claude-sonnet-4-5 (anthropic)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("claude-opus-4-5")
            && stdout.contains("gemini-2.5-pro")
            && stdout.contains("gpt-5")
    );
    assert!(!stdout.contains("very-secret") && !stdout.contains("gm-secret"));
    let json = p.command(&["models", "--json"]).output().unwrap();
    let report: Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(report["default_model"]["provider"], "anthropic");
    assert_eq!(report["providers"][0]["configured"], true);
    assert!(!String::from_utf8_lossy(&json.stdout).contains("secret"));
}

#[test]
fn a_broken_config_file_is_reported_with_its_path() {
    let p = Project::new();
    p.write(
        ".config/trellis/config.toml",
        "[providers.anthropic\napi_key = 3\n",
    );
    let out = p.command(&["models"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("config.toml is not valid"), "{stderr}");
}
