//! Access control for pub/sub clients: the topic filters a client may publish to and
//! subscribe with.

use crate::topic::matches;

/// What one client may do, as MQTT topic filters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Acl {
    /// A PUBLISH is allowed when its topic matches one of these.
    pub publish: Vec<String>,
    /// A SUBSCRIBE is allowed when every topic its filter can match is matched by one of
    /// these (for `$share/{group}/{filter}`, the filter after the group).
    pub subscribe: Vec<String>,
}

impl Acl {
    /// May the client publish to `topic`?
    pub fn may_publish(&self, topic: &str) -> bool {
        self.publish.iter().any(|f| matches(f, topic))
    }

    /// May the client subscribe with `filter` (a `$share/{group}/` prefix is looked through)?
    pub fn may_subscribe(&self, filter: &str) -> bool {
        let plain = filter.strip_prefix("$share/").and_then(|r| r.split_once('/')).map_or(filter, |(_, f)| f);
        self.subscribe.iter().any(|a| covers(a, plain))
    }
}

/// Does ACL filter `acl` match every topic that `filter` can match?
pub fn covers(acl: &str, filter: &str) -> bool {
    // Wildcards at the first level do not match `$` topics, so they cannot cover them.
    if filter.starts_with('$') && (acl.starts_with('+') || acl.starts_with('#')) {
        return false;
    }
    let mut a = acl.split('/');
    let mut f = filter.split('/');
    loop {
        match (a.next(), f.next()) {
            (Some("#"), _) => return true,
            (Some(_), Some("#")) => return false,
            (Some("+"), Some(_)) => {}
            (Some(x), Some(y)) if x == y && y != "+" => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coverage_of_filters_by_filters() {
        for (acl, filter, want) in [
            ("#", "a/b", true),
            ("#", "#", true),
            ("#", "$SYS/x", false),
            ("$SYS/#", "$SYS/x", true),
            ("a/#", "a", true),
            ("a/#", "a/+/c", true),
            ("a/#", "b/#", false),
            ("a/+", "a/b", true),
            ("a/+", "a/+", true),
            ("a/+", "a/#", false),
            ("a/+", "a/b/c", false),
            ("a/b", "a/+", false),
            ("a/b", "a/b", true),
            ("+/b", "x/b", true),
            ("+/b", "#", false),
        ] {
            assert_eq!(covers(acl, filter), want, "covers({acl:?}, {filter:?})");
        }
    }

    #[test]
    fn publish_and_subscribe_rules() {
        let acl = Acl {
            publish: vec!["apps/me/#".into()],
            subscribe: vec!["gridlinks/devices/+/telemetry".into(), "apps/#".into()],
        };
        assert!(acl.may_publish("apps/me/x"));
        assert!(!acl.may_publish("apps/other/x"));
        assert!(acl.may_subscribe("gridlinks/devices/+/telemetry"));
        assert!(acl.may_subscribe("$share/g/apps/+/y"));
        assert!(!acl.may_subscribe("gridlinks/devices/#"));
        assert!(!acl.may_subscribe("$share/g/other"));
        assert!(!Acl::default().may_publish("a"));
    }
}
