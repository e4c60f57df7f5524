//! Text shown to people and models: cutting long values with a marker that says how much was left out,
//! and the end of a long message (the tail of standard error a failure quotes).

/// `text` cut to `limit` characters, saying how much was left out.
pub fn clip(text: &str, limit: usize) -> String {
    let count = text.chars().count();
    if count <= limit {
        return text.to_owned();
    }
    let kept: String = text.chars().take(limit).collect();
    format!("{kept}… ({} more characters)", count - limit)
}

/// The last `chars` characters of `text` (all of it when shorter).
pub fn tail(text: &str, chars: usize) -> &str {
    let count = text.chars().count();
    if count <= chars {
        return text;
    }
    let skip = text.char_indices().nth(count - chars).map_or(0, |(i, _)| i);
    &text[skip..]
}
