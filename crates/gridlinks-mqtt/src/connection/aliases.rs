//! MQTT 5 topic aliases of one connection, both ways: the client's (it sets them, we
//! resolve them) and ours towards it (within its Topic Alias Maximum, a topic is sent once
//! with its alias and then as the alias alone). Allocated when a connection first needs
//! them.

use rustc_hash::FxHashMap as HashMap;

/// Both directions' aliases.
#[derive(Default)]
pub(super) struct Aliases {
    /// The client's (index = alias - 1).
    pub(super) inbound: Vec<Option<String>>,
    /// The client's Topic Alias Maximum: how many of ours it takes (0: none).
    out_max: u16,
    /// Ours: topic → alias.
    out: HashMap<String, u16>,
    /// Ours: alias - 1 → topic.
    out_topics: Vec<String>,
    /// The alias given to another topic next, once all are taken (round robin).
    next: u16,
}

impl Aliases {
    /// Aliases towards a client that takes `max`.
    pub(super) fn towards(max: u16) -> Self {
        Self { out_max: max, ..Self::default() }
    }

    /// The alias to send `topic` with, and whether the topic goes along (the alias is new
    /// or given to another topic now, or `resend`: a redelivery repeats it); `None` when the
    /// client takes no aliases.
    pub(super) fn outbound(&mut self, topic: &str, resend: bool) -> Option<(u16, bool)> {
        if self.out_max == 0 || topic.is_empty() {
            return None;
        }
        if let Some(&alias) = self.out.get(topic) {
            return Some((alias, resend));
        }
        let alias = if self.out_topics.len() < usize::from(self.out_max) {
            self.out_topics.push(topic.to_owned());
            self.out_topics.len() as u16
        } else {
            let alias = self.next % self.out_max + 1;
            self.next = alias % self.out_max;
            let slot = &mut self.out_topics[usize::from(alias - 1)];
            self.out.remove(slot.as_str());
            *slot = topic.to_owned();
            alias
        };
        self.out.insert(topic.to_owned(), alias);
        Some((alias, true))
    }

    /// Forgets the alias `topic` was just given: the packet that would have told the client
    /// was not sent (the next one names the topic again).
    pub(super) fn unsent(&mut self, topic: &str) {
        if let Some(alias) = self.out.remove(topic) {
            if let Some(slot) = self.out_topics.get_mut(usize::from(alias - 1)) {
                slot.clear();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_get_aliases_sent_once_then_replaced_round_robin() {
        let mut a = Aliases::towards(2);
        assert_eq!(a.outbound("x/1", false), Some((1, true)));
        assert_eq!(a.outbound("x/1", false), Some((1, false)));
        assert_eq!(a.outbound("x/1", true), Some((1, true)), "a redelivery names the topic");
        assert_eq!(a.outbound("x/2", false), Some((2, true)));
        // Full: the oldest alias goes to the new topic, which is sent with it.
        assert_eq!(a.outbound("x/3", false), Some((1, true)));
        assert_eq!(a.outbound("x/1", false), Some((2, true)), "x/1 lost its alias, x/2's is next");
        assert_eq!(a.outbound("x/3", false), Some((1, false)));
        // An unsent definition is forgotten: the topic is named again next time.
        assert_eq!(a.outbound("x/4", false), Some((1, true)));
        a.unsent("x/4");
        assert_eq!(a.outbound("x/4", false).map(|(_, with_topic)| with_topic), Some(true));
        assert_eq!(Aliases::towards(0).outbound("x", false), None);
        assert_eq!(a.outbound("", false), None);
    }
}
