//! The run context: the shared key-value store stages read and write. Thread-safe (parallel branches
//! and the engine share it) and cheap to deep-copy for a branch. Values are JSON; large values live in
//! the blob store as `blob://sha256/<hex>` references, which the condition view resolves. It remembers
//! which keys were set since the engine last took the changes, so a checkpoint journals only those.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use parking_lot::RwLock;
use serde_json::Value;
use trellis_workflow::{ConditionScope, StageStatus};

use crate::blob::BlobStore;
use crate::keys;

/// The shared context of one run (or one parallel branch).
#[derive(Debug, Clone, Default)]
pub struct RunContext {
    inner: Arc<RwLock<Values>>,
}

#[derive(Debug, Default)]
struct Values {
    values: BTreeMap<String, Value>,
    /// Keys set since the changes were last taken.
    changed: BTreeSet<String>,
}

impl RunContext {
    pub fn from_map(values: BTreeMap<String, Value>) -> Self {
        Self {
            inner: Arc::new(RwLock::new(Values {
                values,
                changed: BTreeSet::new(),
            })),
        }
    }

    fn read(&self) -> parking_lot::RwLockReadGuard<'_, Values> {
        self.inner.read()
    }

    fn write(&self) -> parking_lot::RwLockWriteGuard<'_, Values> {
        self.inner.write()
    }

    pub fn get(&self, key: &str) -> Option<Value> {
        self.read().values.get(key).cloned()
    }

    pub fn get_str(&self, key: &str) -> Option<String> {
        self.get(key).and_then(|v| v.as_str().map(str::to_owned))
    }

    pub fn set(&self, key: impl Into<String>, value: impl Into<Value>) {
        let key = key.into();
        let mut inner = self.write();
        inner.changed.insert(key.clone());
        inner.values.insert(key, value.into());
    }

    pub fn merge(&self, updates: &BTreeMap<String, Value>) {
        let mut inner = self.write();
        for (key, value) in updates {
            inner.changed.insert(key.clone());
            inner.values.insert(key.clone(), value.clone());
        }
    }

    /// A copy of every value, for checkpoints and display.
    pub fn snapshot(&self) -> BTreeMap<String, Value> {
        self.read().values.clone()
    }

    /// The keys set since the last call, with their values, and forgets them.
    pub fn take_changes(&self) -> BTreeMap<String, Value> {
        let mut inner = self.write();
        let changed = std::mem::take(&mut inner.changed);
        changed
            .into_iter()
            .filter_map(|key| {
                let value = inner.values.get(&key)?.clone();
                Some((key, value))
            })
            .collect()
    }

    /// An independent copy: what a parallel branch starts from.
    #[must_use]
    pub fn deep_copy(&self) -> RunContext {
        RunContext::from_map(self.snapshot())
    }
}

/// What conditions see: the stage's outcome and preferred label, and the context with blob references
/// replaced by their content.
pub struct ConditionView<'a> {
    pub context: &'a RunContext,
    pub outcome: Option<StageStatus>,
    pub preferred_label: Option<&'a str>,
    pub blobs: &'a dyn BlobStore,
}

impl ConditionScope for ConditionView<'_> {
    fn outcome(&self) -> Option<StageStatus> {
        self.outcome
    }

    fn preferred_label(&self) -> Option<&str> {
        self.preferred_label
    }

    fn context_value(&self, key: &str) -> Option<Value> {
        match self.context.get(key) {
            Some(value) => Some(resolve_blob(value, self.blobs)),
            None => keys::read_as_zero(key).then(|| Value::from(0)),
        }
    }
}

/// Whether resolving `value` reads the blob store: it is a blob reference, other than the empty
/// blob's.
pub fn reads_blobs(value: &Value) -> bool {
    value
        .as_str()
        .is_some_and(|s| s.starts_with(crate::blob::BLOB_PREFIX) && s != crate::blob::EMPTY_BLOB)
}

/// Replaces a blob reference by the value it stands for (the text, or the JSON it held).
pub fn resolve_blob(value: Value, blobs: &dyn BlobStore) -> Value {
    match &value {
        Value::String(s) if s == crate::blob::EMPTY_BLOB => Value::String(String::new()),
        Value::String(s) if s.starts_with(crate::blob::BLOB_PREFIX) => match blobs.get(s) {
            Ok(bytes) => {
                let text = String::from_utf8_lossy(&bytes).into_owned();
                serde_json::from_str::<Value>(&text)
                    .ok()
                    .filter(|v| !v.is_string())
                    .unwrap_or(Value::String(text))
            }
            Err(_) => value,
        },
        _ => value,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blob::EMPTY_BLOB;
    use crate::services::memory::MemoryBlobs;

    #[test]
    fn the_empty_blob_resolves_without_a_read() {
        // The store has no such blob: the value is known without asking it.
        let blobs = MemoryBlobs::default();
        assert!(!reads_blobs(&Value::from(EMPTY_BLOB)));
        assert_eq!(
            resolve_blob(Value::from(EMPTY_BLOB), &blobs),
            Value::from("")
        );
        let stored = blobs.put(b"[1, 2]").unwrap();
        assert!(reads_blobs(&Value::from(stored.as_str())));
        assert_eq!(
            resolve_blob(Value::from(stored), &blobs),
            serde_json::json!([1, 2])
        );
        assert!(!reads_blobs(&Value::from("plain text")));
    }
}
