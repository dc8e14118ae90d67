//! Topic names and filters (MQTT 3.1.1 §4.7, MQTT 5 §4.7).

/// Why a topic filter is invalid.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FilterError {
    /// Empty filter.
    #[error("topic filter is empty")]
    Empty,
    /// `#` not alone in the last level, or `+` not alone in its level.
    #[error("wildcard must occupy a whole level, and '#' must be last")]
    Wildcard,
}

/// Checks a subscription filter.
pub fn validate_filter(filter: &str) -> Result<(), FilterError> {
    if filter.is_empty() {
        return Err(FilterError::Empty);
    }
    let mut levels = filter.split('/').peekable();
    while let Some(level) = levels.next() {
        let last = levels.peek().is_none();
        if level.contains('#') && (level != "#" || !last) {
            return Err(FilterError::Wildcard);
        }
        if level.contains('+') && level != "+" {
            return Err(FilterError::Wildcard);
        }
    }
    Ok(())
}

/// Does `topic` match `filter`? Wildcards at the first level do not match `$` topics.
pub fn matches(filter: &str, topic: &str) -> bool {
    if topic.starts_with('$') && (filter.starts_with('+') || filter.starts_with('#')) {
        return false;
    }
    let mut f = filter.split('/');
    let mut t = topic.split('/');
    loop {
        match (f.next(), t.next()) {
            (Some("#"), _) => return true,
            (Some("+"), Some(_)) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// Is there a topic that both filters match? (Neither may start with `$`.)
pub fn filters_overlap(a: &str, b: &str) -> bool {
    let mut x = a.split('/');
    let mut y = b.split('/');
    loop {
        match (x.next(), y.next()) {
            (Some("#"), _) | (_, Some("#")) => return true,
            (Some("+"), Some(_)) | (Some(_), Some("+")) => {}
            (Some(p), Some(q)) if p == q => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlap_of_two_filters() {
        let p = "gridlinks/devices/+/telemetry";
        for (f, want) in [
            ("#", true),
            ("gridlinks/#", true),
            ("+/devices/d1/telemetry", true),
            ("gridlinks/devices/d1/+", true),
            ("gridlinks/devices/+", false),
            ("gridlinks/devices/d1/attributes", false),
            ("other/#", false),
            ("gridlinks/devices/d1/telemetry/x", false),
        ] {
            assert_eq!(filters_overlap(f, p), want, "{f}");
            assert_eq!(filters_overlap(p, f), want, "{f} (swapped)");
        }
    }

    #[test]
    fn filters_validate() {
        for ok in ["a", "a/b", "+", "#", "a/+/c", "a/#", "+/+", "/", "$SYS/#"] {
            assert_eq!(validate_filter(ok), Ok(()), "{ok}");
        }
        for bad in ["", "a#", "a/#/b", "a+", "a/b+/c", "##"] {
            assert!(validate_filter(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn matching_follows_the_spec() {
        assert!(matches("v1/devices/me/rpc/request/+", "v1/devices/me/rpc/request/7"));
        assert!(!matches("v1/devices/me/rpc/request/+", "v1/devices/me/rpc/request/7/x"));
        assert!(matches("a/#", "a"));
        assert!(matches("a/#", "a/b/c"));
        assert!(matches("#", "a/b"));
        assert!(matches("+/+", "/x"));
        assert!(!matches("a/b", "a/b/c"));
        assert!(!matches("a/b/c", "a/b"));
        assert!(!matches("#", "$SYS/x"));
        assert!(matches("$SYS/#", "$SYS/x"));
    }
}
