//! Access control for pub/sub clients: ordered allow/deny rules, then the topic filters a
//! client may publish to and subscribe with.
//!
//! Rules are read in order and the first that matches decides. A publish matches a rule
//! whose filter matches its topic. A subscription matches an allow rule whose filter covers
//! every topic it can match, and a deny rule whose filter does; a deny rule that covers only
//! part of it (`a/#` against a denied `a/secret/#`) leaves the subscription to the rules
//! after it, and takes the denied topics out at delivery ([`Acl::withheld`]). Without a
//! matching rule, the allow lists decide.

use crate::topic::matches;

/// Allow or deny (`allow`, `deny` in configuration and REST).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Permission {
    /// The rule allows.
    Allow,
    /// The rule denies.
    Deny,
}

/// What a rule is about (`publish`, `subscribe`, `all` in configuration and REST).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Publishing.
    Publish,
    /// Subscribing (and receiving).
    Subscribe,
    /// Both.
    All,
}

/// One rule: a permission for an action on the topics a filter matches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// Allow or deny.
    pub permission: Permission,
    /// Publishing, subscribing or both.
    pub action: Action,
    /// A topic filter.
    pub filter: String,
}

impl Rule {
    fn publishing(&self) -> bool {
        self.action != Action::Subscribe
    }

    fn subscribing(&self) -> bool {
        self.action != Action::Publish
    }
}

/// What one client may do.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Acl {
    /// Ordered rules, read before the allow lists; the first that matches decides.
    pub rules: Vec<Rule>,
    /// A PUBLISH no rule decides is allowed when its topic matches one of these.
    pub publish: Vec<String>,
    /// A SUBSCRIBE no rule decides is allowed when every topic its filter can match is
    /// matched by one of these (for `$share/{group}/{filter}`, the filter after the group).
    pub subscribe: Vec<String>,
}

impl Acl {
    /// May the client publish to `topic`?
    pub fn may_publish(&self, topic: &str) -> bool {
        match self.rules.iter().find(|r| r.publishing() && matches(&r.filter, topic)) {
            Some(rule) => rule.permission == Permission::Allow,
            None => self.publish.iter().any(|f| matches(f, topic)),
        }
    }

    /// May the client subscribe with `filter` (a `$share/{group}/` prefix is looked through)?
    pub fn may_subscribe(&self, filter: &str) -> bool {
        let plain = filter.strip_prefix("$share/").and_then(|r| r.split_once('/')).map_or(filter, |(_, f)| f);
        match self.rules.iter().find(|r| r.subscribing() && covers(&r.filter, plain)) {
            Some(rule) => rule.permission == Permission::Allow,
            None => self.subscribe.iter().any(|a| covers(a, plain)),
        }
    }

    /// Whether some rule may take topics out of a granted subscription: then every copy is
    /// checked with [`Acl::withheld`] before it is queued.
    pub fn filters_delivery(&self) -> bool {
        self.rules.iter().any(|r| r.subscribing() && r.permission == Permission::Deny)
    }

    /// Is a message on `topic` kept from this client although a subscription of its matches
    /// it (the first subscribe rule that matches the topic denies)?
    pub fn withheld(&self, topic: &str) -> bool {
        self.rules
            .iter()
            .find(|r| r.subscribing() && matches(&r.filter, topic))
            .is_some_and(|r| r.permission == Permission::Deny)
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
            rules: Vec::new(),
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

    fn rule(permission: Permission, action: Action, filter: &str) -> Rule {
        Rule { permission, action, filter: filter.into() }
    }

    #[test]
    fn the_first_matching_rule_decides_then_the_allow_lists() {
        use Action::*;
        use Permission::*;
        let acl = Acl {
            rules: vec![
                rule(Deny, Publish, "apps/me/locked"),
                rule(Deny, All, "a/secret/#"),
                rule(Allow, Subscribe, "a/secret/open"),
                rule(Allow, All, "shared/+"),
            ],
            publish: vec!["apps/me/#".into(), "a/#".into()],
            subscribe: vec!["a/#".into()],
        };
        assert!(acl.may_publish("apps/me/x"));
        assert!(!acl.may_publish("apps/me/locked"), "a deny rule inside an allowed filter");
        assert!(!acl.may_publish("a/secret/x"));
        assert!(acl.may_publish("shared/x"), "a rule allows beyond the lists");
        assert!(!acl.may_publish("elsewhere"));
        // A subscription the deny rule covers is refused; one it only overlaps is granted
        // and the denied topics are withheld at delivery.
        assert!(!acl.may_subscribe("a/secret/#"));
        assert!(!acl.may_subscribe("a/secret/open"), "the earlier deny rule covers it");
        assert!(acl.may_subscribe("a/#"));
        assert!(acl.may_subscribe("$share/g/a/+/x"));
        assert!(acl.filters_delivery());
        assert!(acl.withheld("a/secret/x") && acl.withheld("a/secret"));
        assert!(!acl.withheld("a/public") && !acl.withheld("shared/x"));
        // Publish-only deny rules do not filter delivery.
        let publish_only = Acl { rules: vec![rule(Deny, Publish, "x")], ..Acl::default() };
        assert!(!publish_only.filters_delivery() && !publish_only.withheld("x"));
    }
}
