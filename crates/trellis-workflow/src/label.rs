//! Edge label matching, shared by human gates, routing directives and `preferred_label` conditions:
//! accelerator prefixes (`[A] `, `A) `, `A - `) are stripped, case and surrounding space ignored.

/// The accelerator key of a label (`[A] Approve` → `A`), if it has one.
pub fn accelerator(label: &str) -> Option<char> {
    let label = label.trim();
    let mut chars = label.chars();
    let first = chars.next()?;
    if first == '[' {
        let key = chars.next()?;
        return (chars.next()? == ']' && key.is_alphanumeric()).then_some(key.to_ascii_uppercase());
    }
    let rest = chars.as_str();
    (first.is_alphanumeric() && (rest.starts_with(") ") || rest.starts_with(" - ")))
        .then_some(first.to_ascii_uppercase())
}

/// The label without its accelerator, lower-cased and trimmed.
pub fn normalize_label(label: &str) -> String {
    let label = label.trim();
    let stripped = if accelerator(label).is_some() {
        if label.starts_with('[') {
            &label[label.find(']').map_or(0, |i| i + 1)..]
        } else if let Some(i) = label.find(") ") {
            &label[i + 2..]
        } else {
            &label[label.find(" - ").map_or(0, |i| i + 3)..]
        }
    } else {
        label
    };
    stripped.trim().to_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accelerators_are_stripped() {
        assert_eq!(normalize_label("[A] Approve"), "approve");
        assert_eq!(normalize_label("R) Revise"), "revise");
        assert_eq!(normalize_label("S - Skip"), "skip");
        assert_eq!(normalize_label("  Fix "), "fix");
        assert_eq!(accelerator("[a] Approve"), Some('A'));
        assert_eq!(accelerator("Approve"), None);
    }
}
