//! Loop detection: when the last 10 tool calls repeat with a period of 1, 2 or 3 (the same tools with
//! the same arguments, over and over), the model is stuck. The session tells it so and reports an
//! `Agent.LoopDetected` event; the window then starts afresh, so one loop is reported once.

use serde_json::Value;

/// How many recent calls are compared.
pub const WINDOW: usize = 10;
const PERIODS: [usize; 3] = [1, 2, 3];

#[derive(Debug, Default)]
pub struct LoopDetector {
    recent: Vec<String>,
}

/// A detected loop: its period and the tools in one cycle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loop {
    pub period: usize,
    pub tools: Vec<String>,
}

impl LoopDetector {
    /// Records a call; returns the loop it completes, if any.
    pub fn record(&mut self, tool: &str, arguments: &Value) -> Option<Loop> {
        self.recent.push(format!("{tool}\u{0}{arguments}"));
        if self.recent.len() > WINDOW {
            self.recent.remove(0);
        }
        if self.recent.len() < WINDOW {
            return None;
        }
        let period = PERIODS
            .into_iter()
            .find(|&p| (p..WINDOW).all(|i| self.recent[i] == self.recent[i - p]))?;
        let tools = self.recent[WINDOW - period..]
            .iter()
            .map(|s| s.split('\u{0}').next().unwrap_or_default().to_owned())
            .collect();
        self.recent.clear();
        Some(Loop { period, tools })
    }
}

impl Loop {
    /// The warning the model is sent.
    pub fn warning(&self) -> String {
        format!(
            "Loop detected: your last {WINDOW} tool calls repeat the same {} call(s) ({}) with the same arguments. \
             Repeating them will not give a different result. Step back, reconsider your approach, and try \
             something different — or, if the task is done, answer without calling a tool.",
            self.period,
            self.tools.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn period_one_two_and_three_are_found_and_reported_once() {
        for period in [1usize, 2, 3] {
            let mut detector = LoopDetector::default();
            let mut found = Vec::new();
            for i in 0..25 {
                let path = format!("f{}", i % period);
                if let Some(l) = detector.record("read_file", &json!({ "path": path })) {
                    found.push((i, l.period));
                }
            }
            assert_eq!(found, [(9, period), (19, period)], "period {period}");
        }
    }

    #[test]
    fn varied_calls_are_not_a_loop() {
        let mut detector = LoopDetector::default();
        for i in 0..30 {
            assert_eq!(
                detector.record("read_file", &json!({ "path": i % 4 })),
                None
            );
        }
    }
}
