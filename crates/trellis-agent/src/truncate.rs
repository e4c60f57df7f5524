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
    match keep {
        Keep::Head => format!(
            "{}\n[… {} characters cut …]\n",
            take_chars(text, limit),
            count - limit
        ),
        Keep::HeadAndTail => {
            let half = limit / 2;
            let mut head = take_chars(text, half);
            let mut tail = &text[byte_at(text, count - (limit - half))..];
            // Whole lines where that keeps most of each part: half a line (`…/function.rs` cut to
            // `tion.rs`) reads to a model as a name of its own.
            if let Some(end) = head.rfind('\n').filter(|&end| end + 1 >= head.len() / 2) {
                head = &head[..=end];
            }
            if let Some(start) = tail.find('\n').filter(|&start| start < tail.len() / 2) {
                tail = &tail[start + 1..];
            }
            let cut = count - head.chars().count() - tail.chars().count();
            let before = if head.ends_with('\n') { "" } else { "\n" };
            format!("{head}{before}[… {cut} characters cut …]\n{tail}")
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
    fn head_and_tail_keep_whole_lines_where_most_of_each_part_stays() {
        let limit = Limit {
            chars: 20,
            lines: 100,
            keep: Keep::HeadAndTail,
        };
        // Lines of 4 characters and a newline: the head ends and the tail starts on a line's edge.
        let text = "ab1\nab2\nab3\nab4\nab5\nab6\nab7\nab8\n";
        assert_eq!(
            limit.apply(text),
            "ab1\nab2\n[… 16 characters cut …]\nab7\nab8\n"
        );
        // One long line: cut where the budget says, as before.
        let long = format!("{}\n", "x".repeat(40));
        assert!(
            limit
                .apply(&long)
                .starts_with("xxxxxxxxxx\n[… 21 characters cut …]\n")
        );
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
