//! Topic name and topic filter syntax (MQTT 3.1.1 §4.7, MQTT 5 §4.7).
//!
//! The decoder enforces [`is_valid_topic_name`] on PUBLISH topics, will topics and
//! response topics. Filters are only checked to be valid strings by the decoder:
//! in MQTT 5 a bad filter is answered per filter with SUBACK 0x8F, so the server
//! applies [`is_valid_topic_filter`] itself.

/// Multi-level wildcard.
pub const MULTI_LEVEL_WILDCARD: char = '#';
/// Single-level wildcard.
pub const SINGLE_LEVEL_WILDCARD: char = '+';
/// Level separator.
pub const LEVEL_SEPARATOR: char = '/';

/// True if `name` may be used as a topic name: non-empty and free of wildcards.
/// (An empty PUBLISH topic with an MQTT 5 topic alias is handled by the decoder.)
pub fn is_valid_topic_name(name: &str) -> bool {
    !name.is_empty() && !has_wildcard(name)
}

/// True if `name` contains `+` or `#`.
pub fn has_wildcard(name: &str) -> bool {
    name.contains([MULTI_LEVEL_WILDCARD, SINGLE_LEVEL_WILDCARD])
}

/// True if `filter` is a syntactically valid topic filter: non-empty, `+` only as a
/// whole level, `#` only as the whole last level. Shared-subscription syntax
/// (`$share/{group}/{filter}`) is the server's to interpret.
pub fn is_valid_topic_filter(filter: &str) -> bool {
    if filter.is_empty() {
        return false;
    }
    let mut levels = filter.split(LEVEL_SEPARATOR).peekable();
    while let Some(level) = levels.next() {
        let is_last = levels.peek().is_none();
        if level.contains(MULTI_LEVEL_WILDCARD) && (level.len() != 1 || !is_last) {
            return false;
        }
        if level.contains(SINGLE_LEVEL_WILDCARD) && level.len() != 1 {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters() {
        for ok in ["#", "+", "a/+/b", "a/#", "/", "+/+", "sport/tennis/#", "$share/g/a/#"] {
            assert!(is_valid_topic_filter(ok), "{ok}");
        }
        for bad in ["", "a#", "a/#/b", "a+", "a/b+/c", "##"] {
            assert!(!is_valid_topic_filter(bad), "{bad}");
        }
    }

    #[test]
    fn names() {
        assert!(is_valid_topic_name("a/b"));
        assert!(is_valid_topic_name("/"));
        assert!(!is_valid_topic_name(""));
        assert!(!is_valid_topic_name("a/+"));
        assert!(!is_valid_topic_name("a/#"));
    }
}
