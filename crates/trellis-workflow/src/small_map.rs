//! [`SmallMap`]: a map from names to values kept as a vector sorted by name. Nodes and edges carry a
//! handful of attributes each; a tree or hash map per node costs a kilobyte or more, which in a
//! 10,000-node workflow is most of its memory. Lookups are binary searches; iteration is in name
//! order, as a `BTreeMap`'s. A key that is a known attribute name is not kept as a string of its own
//! but as the name in the table of known attributes (`Name`).

use std::borrow::{Borrow, Cow};

use crate::rules::unknown_attribute::KNOWN_NAMES;

/// Up to this many entries, a lookup scans them.
const LINEAR: usize = 8;

/// A key: a known attribute name from the static tables, or a string of its own.
type Name = Cow<'static, str>;

/// `key` as a [`Name`]: the known name when it is one (nothing copied), else its own string.
fn name(key: impl AsRef<str> + Into<Name>) -> Name {
    match KNOWN_NAMES.get(key.as_ref()) {
        Some(&known) => Cow::Borrowed(known),
        None => key.into(),
    }
}

/// `key` as a [`Name`], copied only when it is not a known name.
fn copied_name(key: &str) -> Name {
    match KNOWN_NAMES.get(key) {
        Some(&known) => Cow::Borrowed(known),
        None => Cow::Owned(key.to_owned()),
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

    /// Where `key` is: most maps hold a handful of entries, where comparing lengths and first
    /// bytes beats a binary search's ordering of whole names.
    fn find(&self, key: &str) -> Option<usize> {
        if self.entries.len() <= LINEAR {
            // Length and first byte before the whole name: most names differ in one of them.
            let (len, first) = (key.len(), key.as_bytes().first());
            self.entries.iter().position(|(name, _)| {
                name.len() == len && name.as_bytes().first() == first && name.as_ref() == key
            })
        } else {
            self.position(key).ok()
        }
    }

    /// Sets `key`, returning the value it replaced.
    pub fn insert(&mut self, key: impl AsRef<str> + Into<Name>, value: V) -> Option<V> {
        match self.position(key.as_ref()) {
            Ok(at) => Some(std::mem::replace(&mut self.entries[at].1, value)),
            Err(at) => {
                self.add(at, name(key), value);
                None
            }
        }
    }

    fn add(&mut self, at: usize, name: Name, value: V) {
        // One at a time: a handful of entries, never a doubling's slack.
        self.entries.reserve_exact(1);
        self.entries.insert(at, (name, value));
    }

    /// Sets `key` (copied only when it is not a known name), returning the value it replaced.
    pub fn insert_str(&mut self, key: &str, value: V) -> Option<V> {
        match self.position(key) {
            Ok(at) => Some(std::mem::replace(&mut self.entries[at].1, value)),
            Err(at) => {
                self.add(at, copied_name(key), value);
                None
            }
        }
    }

    /// Sets the entry of the key `value` carries (`key` reads it), returning the value it replaced:
    /// a known name is not copied.
    pub fn insert_keyed(&mut self, value: V, key: impl Fn(&V) -> &str) -> Option<V> {
        match self.position(key(&value)) {
            Ok(at) => Some(std::mem::replace(&mut self.entries[at].1, value)),
            Err(at) => {
                self.add(at, copied_name(key(&value)), value);
                None
            }
        }
    }

    pub fn get<Q: Borrow<str> + ?Sized>(&self, key: &Q) -> Option<&V> {
        let at = self.find(key.borrow())?;
        Some(&self.entries[at].1)
    }

    pub fn get_mut<Q: Borrow<str> + ?Sized>(&mut self, key: &Q) -> Option<&mut V> {
        let at = self.find(key.borrow())?;
        Some(&mut self.entries[at].1)
    }

    pub fn contains_key<Q: Borrow<str> + ?Sized>(&self, key: &Q) -> bool {
        self.find(key.borrow()).is_some()
    }

    pub fn remove<Q: Borrow<str> + ?Sized>(&mut self, key: &Q) -> Option<V> {
        let at = self.find(key.borrow())?;
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

    /// The same keys, with each value mapped and moved.
    pub fn into_map_values<W>(self, mut f: impl FnMut(V) -> W) -> SmallMap<W> {
        // A vector of its own, sized to fit (collecting in place would keep the larger entries'
        // allocation).
        let mut entries = Vec::with_capacity(self.entries.len());
        entries.extend(self.entries.into_iter().map(|(k, v)| (k, f(v))));
        SmallMap { entries }
    }

    /// A copy with room for `additional` more entries.
    #[must_use]
    pub fn clone_with_room(&self, additional: usize) -> Self
    where
        V: Clone,
    {
        let mut entries = Vec::with_capacity(self.entries.len() + additional);
        entries.extend_from_slice(&self.entries);
        Self { entries }
    }

    /// Room for `additional` more entries, exactly (entries are otherwise added one at a time).
    pub fn reserve(&mut self, additional: usize) {
        self.entries.reserve_exact(additional);
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
        assert_eq!(map.insert("b", 1), None);
        assert_eq!(map.insert("a", 2), None);
        assert_eq!(map.insert("b", 3), Some(1));
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

    #[test]
    fn large_maps_are_searched_and_keys_are_shared_when_known() {
        // Past `LINEAR` entries a lookup is a binary search; both ways find the same entries.
        let mut map = SmallMap::new();
        for i in (0..20).rev() {
            map.insert_str(&format!("k{i:02}"), i);
        }
        assert_eq!(map.len(), 20);
        assert!((0..20).all(|i| map.get(&format!("k{i:02}")) == Some(&i)));
        assert_eq!(map.get("k20"), None);
        assert_eq!(map.remove("k05"), Some(5));
        assert!(!map.contains_key("k05"));

        let mut attrs: SmallMap<(String, u8)> = SmallMap::new();
        assert_eq!(
            attrs.insert_keyed(("timeout".to_owned(), 1), |v| &v.0),
            None
        );
        assert_eq!(
            attrs.insert_keyed(("timeout".to_owned(), 2), |v| &v.0),
            Some(("timeout".to_owned(), 1))
        );
        attrs.insert_keyed(("no_such_attribute".to_owned(), 3), |v| &v.0);
        assert!(matches!(attrs.entries[1].0, Cow::Borrowed("timeout")));
        assert!(matches!(attrs.entries[0].0, Cow::Owned(_)));
        let texts = attrs.into_map_values(|(_, n)| n);
        assert_eq!(
            texts.iter().collect::<Vec<_>>(),
            [("no_such_attribute", &3), ("timeout", &2)]
        );
        assert!(matches!(texts.entries[1].0, Cow::Borrowed("timeout")));
    }
}
