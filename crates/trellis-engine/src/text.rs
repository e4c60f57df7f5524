//! Text shown to people and models: cutting long values with a marker that says how much was left out.

/// `text` cut to `limit` characters, saying how much was left out.
pub fn clip(text: &str, limit: usize) -> String {
    let count = text.chars().count();
    if count <= limit {
        return text.to_owned();
    }
    let kept: String = text.chars().take(limit).collect();
    format!("{kept}… ({} more characters)", count - limit)
}
