//! A subscription trie: topic filter levels as edges, subscribers at the nodes.
//! `matches` walks only the branches a topic can reach (exact level, `+`, `#`).

use std::collections::HashMap;

/// Gives back a map's memory once it holds less than a quarter of what it could (so the
/// cost is amortized over the removals that emptied it).
pub(crate) fn shrink<K: std::hash::Hash + Eq, V, H: std::hash::BuildHasher>(m: &mut HashMap<K, V, H>) {
    if m.capacity() > 4 * m.len() + 16 {
        m.shrink_to_fit();
    }
}

/// Subscribers of type `S` keyed by topic filter.
#[derive(Debug)]
pub struct SubscriptionTrie<S> {
    root: Node<S>,
    len: usize,
}

#[derive(Debug)]
struct Node<S> {
    children: HashMap<String, Node<S>>,
    subscribers: Vec<S>,
}

impl<S> Default for Node<S> {
    fn default() -> Self {
        Self { children: HashMap::new(), subscribers: Vec::new() }
    }
}

impl<S> Default for SubscriptionTrie<S> {
    fn default() -> Self {
        Self { root: Node::default(), len: 0 }
    }
}

impl<S: PartialEq + Clone> SubscriptionTrie<S> {
    /// Adds `sub` under `filter`; an equal subscriber there is replaced (so a subscriber
    /// may carry data that its equality ignores, such as options).
    pub fn insert(&mut self, filter: &str, sub: S) {
        let mut node = &mut self.root;
        for level in filter.split('/') {
            node = node.children.entry(level.to_owned()).or_default();
        }
        match node.subscribers.iter_mut().find(|s| **s == sub) {
            Some(old) => *old = sub,
            None => {
                node.subscribers.push(sub);
                self.len += 1;
            }
        }
    }

    /// Removes `sub` from `filter`; returns whether it was there. Empty branches are pruned.
    pub fn remove(&mut self, filter: &str, sub: &S) -> bool {
        let levels: Vec<&str> = filter.split('/').collect();
        let removed = Self::remove_at(&mut self.root, &levels, sub);
        if removed {
            self.len -= 1;
        }
        removed
    }

    fn remove_at(node: &mut Node<S>, levels: &[&str], sub: &S) -> bool {
        match levels.split_first() {
            None => {
                let before = node.subscribers.len();
                node.subscribers.retain(|s| s != sub);
                if node.subscribers.capacity() > 2 * node.subscribers.len() + 4 {
                    node.subscribers.shrink_to_fit();
                }
                node.subscribers.len() != before
            }
            Some((first, rest)) => {
                let Some(child) = node.children.get_mut(*first) else { return false };
                let removed = Self::remove_at(child, rest, sub);
                if child.subscribers.is_empty() && child.children.is_empty() {
                    node.children.remove(*first);
                    // A map keeps its capacity when emptied: 400,000 subscriptions gone
                    // would leave their tables allocated.
                    shrink(&mut node.children);
                }
                removed
            }
        }
    }

    /// Every subscriber whose filter matches `topic` (once per matching filter).
    pub fn matches(&self, topic: &str) -> Vec<S> {
        let levels: Vec<&str> = topic.split('/').collect();
        let mut out = Vec::new();
        Self::collect(&self.root, &levels, topic.starts_with('$'), true, &mut out);
        out
    }

    fn collect(node: &Node<S>, levels: &[&str], dollar: bool, first: bool, out: &mut Vec<S>) {
        let wild_ok = !(dollar && first);
        if wild_ok {
            if let Some(hash) = node.children.get("#") {
                out.extend(hash.subscribers.iter().cloned());
            }
        }
        let Some((level, rest)) = levels.split_first() else {
            out.extend(node.subscribers.iter().cloned());
            return;
        };
        if let Some(child) = node.children.get(*level) {
            Self::collect(child, rest, dollar, false, out);
        }
        if wild_ok {
            if let Some(plus) = node.children.get("+") {
                Self::collect(plus, rest, dollar, false, out);
            }
        }
    }

    /// Number of (filter, subscriber) pairs.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing is subscribed.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topic::matches;

    #[test]
    fn trie_agrees_with_the_matcher() {
        let filters = ["a/b", "a/+", "a/#", "#", "+/b", "a/b/c", "+/+/+", "$SYS/#", "a/+/c", "/", "+"];
        let topics = ["a/b", "a", "a/b/c", "x/b", "$SYS/load", "a/x/c", "/", "b", "a/b/c/d"];
        let mut trie = SubscriptionTrie::default();
        for (i, f) in filters.iter().enumerate() {
            trie.insert(f, i);
        }
        for t in topics {
            let mut got = trie.matches(t);
            got.sort();
            let want: Vec<usize> = filters.iter().enumerate().filter(|(_, f)| matches(f, t)).map(|(i, _)| i).collect();
            assert_eq!(got, want, "topic {t}");
        }
        assert!(trie.remove("a/#", &2));
        assert!(!trie.remove("a/#", &2));
        assert!(!trie.matches("a/b/c").contains(&2));
        assert_eq!(trie.len(), filters.len() - 1);
    }

    #[test]
    fn removing_everything_gives_the_tables_back() {
        let mut trie = SubscriptionTrie::default();
        for i in 0..20_000 {
            trie.insert(&format!("flood/{i}/x"), 1u8);
            trie.insert(&format!("{i}"), 2u8);
        }
        assert!(trie.root.children.capacity() >= 20_000);
        for i in 0..20_000 {
            assert!(trie.remove(&format!("flood/{i}/x"), &1));
            assert!(trie.remove(&format!("{i}"), &2));
        }
        assert!(trie.is_empty());
        assert!(trie.root.children.is_empty());
        assert!(trie.root.children.capacity() < 64, "{}", trie.root.children.capacity());
    }
}
