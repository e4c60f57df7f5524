//! [`SmallMap`]: a map from names to values kept as a vector sorted by name. Nodes and edges carry a
//! handful of attributes each; a tree or hash map per node costs a kilobyte or more, which in a
//! 10,000-node workflow is most of its memory. Lookups are binary searches; iteration is in name
//! order, as a `BTreeMap`'s. A key that is a known attribute name is not kept as a string of its own
//! but as the name in the table of known attributes (`Name`).

use std::borrow::{Borrow, Cow};

use crate::rules::unknown_attribute::KNOWN_NAMES;

/// A key: a known attribute name from the static tables, or a string of its own.
type Name = Cow<'static, str>;

/// `key` as a [`Name`]: the known name when it is one (its string freed), else itself.
fn name(key: String) -> Name {
    match KNOWN_NAMES.binary_search(&key.as_str()) {
        Ok(at) => Cow::Borrowed(KNOWN_NAMES[at]),
        Err(_) => Cow::Owned(key),
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmallMap<V> {
    entries: Vec<(Name, V)>,
}

impl<V> Default for SmallMap<V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<V> SmallMap<V> {
    pub const fn new() -> Self {
        Self {
            entries: Vec::new(),
        }
    }

    fn position(&self, key: &str) -> Result<usize, usize> {
        self.entries
            .binary_search_by(|(name, _)| name.as_ref().cmp(key))
    }

    /// Sets `key`, returning the value it replaced.
    pub fn insert(&mut self, key: String, value: V) -> Option<V> {
        match self.position(&key) {
            Ok(at) => Some(std::mem::replace(&mut self.entries[at].1, value)),
            Err(at) => {
                // One at a time: a handful of entries, never a doubling's slack.
                self.entries.reserve_exact(1);
                self.entries.insert(at, (name(key), value));
                None
            }
        }
    }

    pub fn get<Q: Borrow<str> + ?Sized>(&self, key: &Q) -> Option<&V> {
        let at = self.position(key.borrow()).ok()?;
        Some(&self.entries[at].1)
    }

    pub fn get_mut<Q: Borrow<str> + ?Sized>(&mut self, key: &Q) -> Option<&mut V> {
        let at = self.position(key.borrow()).ok()?;
        Some(&mut self.entries[at].1)
    }

    pub fn contains_key<Q: Borrow<str> + ?Sized>(&self, key: &Q) -> bool {
        self.position(key.borrow()).is_ok()
    }

    pub fn remove<Q: Borrow<str> + ?Sized>(&mut self, key: &Q) -> Option<V> {
        let at = self.position(key.borrow()).ok()?;
        Some(self.entries.remove(at).1)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &V)> {
        self.entries.iter().map(|(k, v)| (k.as_ref(), v))
    }

    /// Each key with its value, to change the values in place.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&str, &mut V)> {
        self.entries.iter_mut().map(|(k, v)| (&**k, v))
    }

    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(k, _)| k.as_ref())
    }

    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.entries.iter().map(|(_, v)| v)
    }

    /// The same keys (known names shared, not copied), with each value mapped.
    pub fn map_values<W>(&self, mut f: impl FnMut(&V) -> W) -> SmallMap<W> {
        SmallMap {
            entries: self
                .entries
                .iter()
                .map(|(k, v)| (k.clone(), f(v)))
                .collect(),
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl<V> FromIterator<(String, V)> for SmallMap<V> {
    fn from_iter<I: IntoIterator<Item = (String, V)>>(iter: I) -> Self {
        let mut entries: Vec<(Name, V)> = iter.into_iter().map(|(k, v)| (name(k), v)).collect();
        // Stable, so the last of equal keys wins after the dedup below keeps the first of each run.
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        entries.reverse();
        entries.dedup_by(|a, b| a.0 == b.0);
        entries.reverse();
        entries.shrink_to_fit();
        Self { entries }
    }
}

impl<V> Extend<(String, V)> for SmallMap<V> {
    fn extend<I: IntoIterator<Item = (String, V)>>(&mut self, iter: I) {
        for (key, value) in iter {
            self.insert(key, value);
        }
    }
}

impl<'a, V> IntoIterator for &'a SmallMap<V> {
    type Item = (&'a str, &'a V);
    type IntoIter =
        std::iter::Map<std::slice::Iter<'a, (Name, V)>, fn(&'a (Name, V)) -> (&'a str, &'a V)>;

    fn into_iter(self) -> Self::IntoIter {
        self.entries.iter().map(|(k, v)| (k.as_ref(), v))
    }
}

impl<V> std::ops::Index<&str> for SmallMap<V> {
    type Output = V;

    fn index(&self, key: &str) -> &V {
        self.get(key).unwrap_or_else(|| panic!("no entry `{key}`"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn behaves_as_a_sorted_map() {
        let mut map = SmallMap::new();
        assert_eq!(map.insert("b".into(), 1), None);
        assert_eq!(map.insert("a".into(), 2), None);
        assert_eq!(map.insert("b".into(), 3), Some(1));
        assert_eq!(map.keys().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(map.get("b"), Some(&3));
        assert!(map.contains_key("a"));
        assert_eq!(map.remove("a"), Some(2));
        assert_eq!(map.len(), 1);
        let collected: SmallMap<i32> = [
            ("x".to_owned(), 1),
            ("w".to_owned(), 2),
            ("x".to_owned(), 3),
        ]
        .into_iter()
        .collect();
        assert_eq!(collected.iter().collect::<Vec<_>>(), [("w", &2), ("x", &3)]);
        let known: SmallMap<()> = [("shape".to_owned(), ())].into_iter().collect();
        assert!(
            matches!(known.entries[0].0, Cow::Borrowed("shape")),
            "a known name is not copied"
        );
    }
}
