//! Cutting a tool's output to what the model is shown: characters first, then lines, keeping the start
//! (or the start and the end), with a marker saying how much was cut. The event keeps the full text.

/// Which part of a long output is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    Head,
    /// Half the budget from the start, half from the end (a command's last lines say how it ended).
    HeadAndTail,
}

/// A tool's output budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    pub chars: usize,
    pub lines: usize,
    pub keep: Keep,
}

impl Limit {
    /// `text` cut to the budget.
    pub fn apply(&self, text: &str) -> String {
        let by_chars = cut_chars(text, self.chars, self.keep);
        cut_lines(&by_chars, self.lines, self.keep)
    }
}

fn cut_chars(text: &str, limit: usize, keep: Keep) -> String {
    let count = text.chars().count();
    if count <= limit {
        return text.to_owned();
    }
    let cut = count - limit;
    let marker = format!("\n[… {cut} characters cut …]\n");
    match keep {
        Keep::Head => format!("{}{marker}", take_chars(text, limit)),
        Keep::HeadAndTail => {
            let head = limit / 2;
            let tail_start = byte_at(text, count - (limit - head));
            format!("{}{marker}{}", take_chars(text, head), &text[tail_start..])
        }
    }
}

fn cut_lines(text: &str, limit: usize, keep: Keep) -> String {
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    if lines.len() <= limit {
        return text.to_owned();
    }
    let cut = lines.len() - limit;
    let marker = format!("[… {cut} lines cut …]\n");
    match keep {
        Keep::Head => format!("{}{marker}", lines[..limit].concat()),
        Keep::HeadAndTail => {
            let head = limit / 2;
            let tail = limit - head;
            format!(
                "{}{marker}{}",
                lines[..head].concat(),
                lines[lines.len() - tail..].concat()
            )
        }
    }
}

fn take_chars(text: &str, n: usize) -> &str {
    &text[..byte_at(text, n)]
}

fn byte_at(text: &str, char_index: usize) -> usize {
    text.char_indices()
        .nth(char_index)
        .map_or(text.len(), |(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_output_is_kept_whole() {
        let limit = Limit {
            chars: 100,
            lines: 10,
            keep: Keep::Head,
        };
        assert_eq!(limit.apply("a\nb\n"), "a\nb\n");
    }

    #[test]
    fn characters_are_cut_first_keeping_head_and_tail() {
        let limit = Limit {
            chars: 10,
            lines: 100,
            keep: Keep::HeadAndTail,
        };
        let out = limit.apply("abcdefghijKLMNOPQRSTuvwxyz");
        assert_eq!(out, "abcde\n[… 16 characters cut …]\nvwxyz");
    }

    #[test]
    fn then_lines_keeping_the_start() {
        let limit = Limit {
            chars: 1000,
            lines: 2,
            keep: Keep::Head,
        };
        assert_eq!(limit.apply("1\n2\n3\n4\n"), "1\n2\n[… 2 lines cut …]\n");
    }

    #[test]
    fn multibyte_text_is_cut_on_character_boundaries() {
        let limit = Limit {
            chars: 3,
            lines: 10,
            keep: Keep::Head,
        };
        assert!(limit.apply("ééééé").starts_with("ééé\n[… 2 characters cut"));
    }
}
