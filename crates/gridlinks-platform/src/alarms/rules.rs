//! Device-profile alarm rules in ThingsBoard's format (`profileData.alarms[]`), compiled
//! once per profile and evaluated against a device's data snapshot. Sans-IO: the engine
//! ([`super::engine`]) feeds it committed data and acts on what it answers.
//!
//! Evaluation follows ThingsBoard's device profile node: create rules are tried from the
//! highest severity down and the first that holds raises (or re-grades) the alarm; while an
//! alarm is active and no create rule holds, the clear rule may clear it. `DURATION` rules
//! hold once their condition has been true for the required time, `REPEATING` ones once it
//! was true in that many consecutive messages; a message where it is false starts them
//! over. A key the device has not reported makes its filter false.

use gridlinks_types::Value;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use serde_json::Value as J;

/// ThingsBoard's alarm severities, highest first in [`Severity::ALL`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Severity {
    /// Lowest.
    Indeterminate,
    /// `WARNING`.
    Warning,
    /// `MINOR`.
    Minor,
    /// `MAJOR`.
    Major,
    /// Highest.
    Critical,
}

impl Severity {
    /// Every severity, highest first.
    pub const ALL: [Severity; 5] =
        [Severity::Critical, Severity::Major, Severity::Minor, Severity::Warning, Severity::Indeterminate];

    /// As ThingsBoard spells it.
    pub fn name(self) -> &'static str {
        match self {
            Severity::Critical => "CRITICAL",
            Severity::Major => "MAJOR",
            Severity::Minor => "MINOR",
            Severity::Warning => "WARNING",
            Severity::Indeterminate => "INDETERMINATE",
        }
    }

    /// Parses ThingsBoard's name.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.name() == s)
    }
}

/// A profile's alarm rules that do not compile, with where.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("alarm rule {at}: {what}")]
pub struct RuleError {
    /// Which rule and field (`alarms[0].createRules.CRITICAL.condition[1]`).
    pub at: String,
    /// What is wrong.
    pub what: String,
}

fn err<T>(at: &str, what: impl Into<String>) -> Result<T, RuleError> {
    Err(RuleError { at: at.to_owned(), what: what.into() })
}

/// Where a filter's value, or a dynamic threshold, comes from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum DataKey {
    /// An attribute of the device (any scope; server over shared over client).
    Attribute(String),
    /// The latest value of a time series key.
    Timeseries(String),
    /// A field of the device itself (`name`, `type`, `label`, `createdTime`…).
    EntityField(String),
    /// A server attribute of the device's customer.
    Customer(String),
    /// A server attribute of the device's tenant.
    Tenant(String),
}

/// A key a rule reads, with its slot: where a device's value of it is kept
/// ([`ProfileAlarms::keys`]), so that evaluating looks nothing up by name.
#[derive(Clone, Debug, PartialEq)]
pub struct KeyRef {
    /// The key.
    pub key: DataKey,
    /// Its index in [`ProfileAlarms::keys`].
    pub slot: usize,
}

/// A threshold: a constant, or an attribute with the constant as its fallback.
#[derive(Clone, Debug, PartialEq)]
pub struct Operand {
    constant: Option<Value>,
    /// The attributes to try, in order (the device's, then with `inherit` its customer's,
    /// then its tenant's).
    dynamic: Vec<KeyRef>,
}

/// A predicate over one value.
#[derive(Clone, Debug, PartialEq)]
pub enum Predicate {
    /// `NUMERIC`.
    Numeric(NumOp, Operand),
    /// `BOOLEAN`: equal (`true`) or not.
    Boolean(bool, Operand),
    /// `STRING`, with `ignoreCase`.
    Text(TextOp, Operand, bool),
    /// `COMPLEX`: all (`true`) or any of.
    Complex(bool, Vec<Predicate>),
}

/// Numeric operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NumOp {
    /// `EQUAL`.
    Eq,
    /// `NOT_EQUAL`.
    Ne,
    /// `GREATER`.
    Gt,
    /// `LESS`.
    Lt,
    /// `GREATER_OR_EQUAL`.
    Ge,
    /// `LESS_OR_EQUAL`.
    Le,
}

/// String operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TextOp {
    /// `EQUAL`.
    Eq,
    /// `NOT_EQUAL`.
    Ne,
    /// `STARTS_WITH`.
    StartsWith,
    /// `ENDS_WITH`.
    EndsWith,
    /// `CONTAINS`.
    Contains,
    /// `NOT_CONTAINS`.
    NotContains,
    /// `IN` (a comma-separated list).
    In,
    /// `NOT_IN`.
    NotIn,
}

/// One filter of a condition: a value (a key's, or a constant) and a predicate on it.
#[derive(Clone, Debug, PartialEq)]
pub struct Filter {
    /// The key; `None` for a `CONSTANT` filter, whose value is `constant`.
    key: Option<KeyRef>,
    constant: Option<Value>,
    predicate: Predicate,
}

/// How long or how often a condition must hold.
#[derive(Clone, Debug, PartialEq)]
pub enum Spec {
    /// At once.
    Simple,
    /// For this many milliseconds (`unit` × the operand).
    Duration(i64, Operand),
    /// In this many messages in a row.
    Repeating(Operand),
}

/// When a rule applies.
#[derive(Clone, Debug, PartialEq)]
pub enum Schedule {
    /// Always.
    AnyTime,
    /// On these days (1 = Monday … 7 = Sunday) between these times of day (ms since
    /// midnight; `starts == ends` is the whole day), in a time zone.
    Specific { tz: jiff::tz::TimeZone, days: Vec<u8>, starts: i64, ends: i64 },
    /// Per day of the week (index 0 = Monday): enabled, starts, ends.
    Custom { tz: jiff::tz::TimeZone, days: [Option<(i64, i64)>; 7] },
}

/// A create or clear rule.
#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    filters: Vec<Filter>,
    spec: Spec,
    schedule: Schedule,
    /// The alarm details template (`${key}` of the condition's keys).
    details: Option<String>,
    dashboard: Option<String>,
}

/// One alarm of a profile: its type, create rules (highest severity first) and clear rule.
#[derive(Clone, Debug, PartialEq)]
pub struct AlarmDef {
    /// The rule's id in the profile.
    pub id: String,
    /// The alarm type it raises.
    pub alarm_type: String,
    /// Create rules, highest severity first.
    pub create: Vec<(Severity, Rule)>,
    /// The clear rule.
    pub clear: Option<Rule>,
    /// `propagate`, `propagateToOwner`, `propagateToTenant`, `propagateRelationTypes`.
    pub propagation: Propagation,
    /// Every key its rules read.
    pub keys: Vec<KeyRef>,
}

/// Where an alarm is also shown besides its originator.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Propagation {
    /// To the originator's related entities.
    pub propagate: bool,
    /// To its owner (customer or tenant).
    pub propagate_to_owner: bool,
    /// To its tenant.
    pub propagate_to_tenant: bool,
    /// Relation types to propagate along (none: all).
    #[serde(default)]
    pub propagate_relation_types: Option<Vec<String>>,
}

/// A profile's compiled alarms.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProfileAlarms {
    /// Its alarms.
    pub alarms: Vec<AlarmDef>,
    /// Every key they read; a key's index here is its slot ([`KeyRef::slot`]).
    pub keys: Vec<DataKey>,
    /// The time series keys they read, by name: the key, and which alarms (indexes into
    /// `alarms`) read it. So a message's keys are looked up without building a key.
    pub timeseries: FxHashMap<String, Reader>,
    /// The device attributes they read, as `timeseries`.
    pub attributes: FxHashMap<String, Reader>,
}

/// A key some of a profile's alarms read.
#[derive(Clone, Debug, PartialEq)]
pub struct Reader {
    /// The key.
    pub key: KeyRef,
    /// The alarms that read it (indexes into [`ProfileAlarms::alarms`]).
    pub alarms: Vec<usize>,
}

impl ProfileAlarms {
    /// Compiles `profileData.alarms` (`null` or absent: no alarms).
    pub fn compile(alarms: Option<&J>) -> Result<Self, RuleError> {
        let list = match alarms {
            None | Some(J::Null) => return Ok(Self::default()),
            Some(J::Array(a)) => a,
            Some(_) => return err("profileData.alarms", "is a list of alarm rules"),
        };
        let mut out = Vec::with_capacity(list.len());
        let mut keys = Vec::new();
        for (i, a) in list.iter().enumerate() {
            let def = compile_alarm(&format!("alarms[{i}]"), a, &mut keys)?;
            if out.iter().any(|d: &AlarmDef| d.alarm_type == def.alarm_type) {
                return err(
                    &format!("alarms[{i}]"),
                    format!("Can't create device profile with the same alarm rule types: \"{}\"!", def.alarm_type),
                );
            }
            out.push(def);
        }
        let (mut timeseries, mut attributes) = (FxHashMap::<String, Reader>::default(), FxHashMap::default());
        for (i, a) in out.iter().enumerate() {
            for k in &a.keys {
                let (DataKey::Timeseries(name) | DataKey::Attribute(name)) = &k.key else { continue };
                let map = if matches!(k.key, DataKey::Timeseries(_)) { &mut timeseries } else { &mut attributes };
                let reader = map.entry(name.clone()).or_insert_with(|| Reader { key: k.clone(), alarms: Vec::new() });
                if !reader.alarms.contains(&i) {
                    reader.alarms.push(i);
                }
            }
        }
        Ok(Self { alarms: out, keys, timeseries, attributes })
    }

    /// Whether the profile has any alarm rule.
    pub fn is_empty(&self) -> bool {
        self.alarms.is_empty()
    }
}

fn str_field<'a>(at: &str, v: &'a J, name: &str) -> Result<&'a str, RuleError> {
    match v.get(name) {
        Some(J::String(s)) if !s.trim().is_empty() => Ok(s),
        _ => err(at, format!("'{name}' must be a non-empty string")),
    }
}

/// `key` with its slot in `keys` (added there when new).
fn slot(keys: &mut Vec<DataKey>, key: DataKey) -> KeyRef {
    let slot = keys.iter().position(|k| *k == key).unwrap_or_else(|| {
        keys.push(key.clone());
        keys.len() - 1
    });
    KeyRef { key, slot }
}

fn compile_alarm(at: &str, a: &J, keys: &mut Vec<DataKey>) -> Result<AlarmDef, RuleError> {
    let Some(alarm_type) = a.get("alarmType").and_then(J::as_str).filter(|t| !t.trim().is_empty()) else {
        return err(at, "Alarm rule type should be specified!");
    };
    let alarm_type = alarm_type.to_owned();
    let id = a.get("id").and_then(J::as_str).unwrap_or(&alarm_type).to_owned();
    let mut create = Vec::new();
    match a.get("createRules") {
        Some(J::Object(rules)) => {
            for (sev, rule) in rules {
                let here = format!("{at}.createRules.{sev}");
                let Some(severity) = Severity::parse(sev) else {
                    return err(&here, "is not a severity (CRITICAL, MAJOR, MINOR, WARNING, INDETERMINATE)");
                };
                create.push((severity, compile_rule(&here, rule, keys)?));
            }
        }
        None | Some(J::Null) => {}
        Some(_) => return err(at, "'createRules' is an object of rules by severity"),
    }
    create.sort_by_key(|r| std::cmp::Reverse(r.0));
    let clear = match a.get("clearRule") {
        None | Some(J::Null) => None,
        Some(r) => Some(compile_rule(&format!("{at}.clearRule"), r, keys)?),
    };
    let propagation = serde_json::from_value(a.clone()).unwrap_or_default();
    let mut read = Vec::new();
    for r in create.iter().map(|(_, r)| r).chain(clear.iter()) {
        r.keys(&mut read);
    }
    Ok(AlarmDef { id, alarm_type, create, clear, propagation, keys: read })
}

fn compile_rule(at: &str, r: &J, keys: &mut Vec<DataKey>) -> Result<Rule, RuleError> {
    let cond = r.get("condition").ok_or_else(|| RuleError { at: at.into(), what: "has no 'condition'".into() })?;
    let list = match cond.get("condition") {
        Some(J::Array(l)) if !l.is_empty() => l,
        _ => return err(&format!("{at}.condition"), "'condition' must be a non-empty list of filters"),
    };
    let filters = list
        .iter()
        .enumerate()
        .map(|(i, f)| compile_filter(&format!("{at}.condition[{i}]"), f, keys))
        .collect::<Result<_, _>>()?;
    let spec = compile_spec(&format!("{at}.condition.spec"), cond.get("spec"), keys)?;
    let schedule = compile_schedule(&format!("{at}.schedule"), r.get("schedule"))?;
    let details = r.get("alarmDetails").and_then(J::as_str).filter(|s| !s.is_empty()).map(str::to_owned);
    let dashboard = r.get("dashboardId").and_then(|d| d.get("id").or(Some(d))).and_then(J::as_str).map(str::to_owned);
    let rule = Rule { filters, spec, schedule, details, dashboard };
    if let Some(t) = &rule.details {
        let known: Vec<&str> = rule.filters.iter().filter_map(|f| key_name(&f.key.as_ref()?.key)).collect();
        for name in template_names(t) {
            if !known.contains(&name) {
                return err(
                    &format!("{at}.alarmDetails"),
                    format!("'${{{name}}}' is not a key of this rule's condition (known: {})", known.join(", ")),
                );
            }
        }
    }
    Ok(rule)
}

/// The name a template refers to a filter's key by.
fn key_name(k: &DataKey) -> Option<&str> {
    match k {
        DataKey::Attribute(n) | DataKey::Timeseries(n) | DataKey::EntityField(n) => Some(n),
        DataKey::Customer(_) | DataKey::Tenant(_) => None,
    }
}

/// The `${name}` references of a template.
fn template_names(t: &str) -> impl Iterator<Item = &str> {
    t.split("${").skip(1).filter_map(|rest| rest.split_once('}').map(|(name, _)| name))
}

const ENTITY_FIELDS: [&str; 6] = ["name", "type", "label", "createdTime", "customerTitle", "deviceName"];

fn compile_filter(at: &str, f: &J, keys: &mut Vec<DataKey>) -> Result<Filter, RuleError> {
    let key = f.get("key").ok_or_else(|| RuleError { at: at.into(), what: "has no 'key'".into() })?;
    let kind = str_field(&format!("{at}.key"), key, "type")?;
    let name = || str_field(&format!("{at}.key"), key, "key").map(str::to_owned);
    let key = match kind {
        "ATTRIBUTE" | "CLIENT_ATTRIBUTE" | "SHARED_ATTRIBUTE" | "SERVER_ATTRIBUTE" => Some(DataKey::Attribute(name()?)),
        "TIME_SERIES" => Some(DataKey::Timeseries(name()?)),
        "ENTITY_FIELD" => {
            let n = name()?;
            if !ENTITY_FIELDS.contains(&n.as_str()) {
                return err(
                    &format!("{at}.key"),
                    format!("'{n}' is not an entity field ({})", ENTITY_FIELDS.join(", ")),
                );
            }
            Some(DataKey::EntityField(n))
        }
        "CONSTANT" => None,
        other => {
            return err(
                &format!("{at}.key"),
                format!("type '{other}' is not ATTRIBUTE, TIME_SERIES, ENTITY_FIELD or CONSTANT"),
            )
        }
    };
    let value_type = str_field(at, f, "valueType")?;
    let constant = match (&key, f.get("value")) {
        (None, Some(v)) if !v.is_null() => Some(constant_value(at, v)?),
        (None, _) => return err(at, "a CONSTANT filter needs a 'value'"),
        _ => None,
    };
    let pred = f.get("predicate").ok_or_else(|| RuleError { at: at.into(), what: "has no 'predicate'".into() })?;
    let predicate = compile_predicate(&format!("{at}.predicate"), pred, value_type, keys)?;
    Ok(Filter { key: key.map(|k| slot(keys, k)), constant, predicate })
}

fn constant_value(at: &str, v: &J) -> Result<Value, RuleError> {
    Value::from_json(v).map_err(|e| RuleError { at: at.into(), what: format!("value {v}: {e}") })
}

fn compile_predicate(at: &str, p: &J, value_type: &str, keys: &mut Vec<DataKey>) -> Result<Predicate, RuleError> {
    let kind = str_field(at, p, "type")?;
    let expected = match value_type {
        "NUMERIC" | "DATE_TIME" => "NUMERIC",
        "BOOLEAN" => "BOOLEAN",
        "STRING" => "STRING",
        other => return err(at, format!("valueType '{other}' is not STRING, NUMERIC, BOOLEAN or DATE_TIME")),
    };
    if kind != "COMPLEX" && kind != expected {
        return err(at, format!("a {kind} predicate cannot test a {value_type} value"));
    }
    let op = || str_field(at, p, "operation");
    Ok(match kind {
        "NUMERIC" => {
            let op = match op()? {
                "EQUAL" => NumOp::Eq,
                "NOT_EQUAL" => NumOp::Ne,
                "GREATER" => NumOp::Gt,
                "LESS" => NumOp::Lt,
                "GREATER_OR_EQUAL" => NumOp::Ge,
                "LESS_OR_EQUAL" => NumOp::Le,
                other => return err(at, format!("'{other}' is not a numeric operation")),
            };
            Predicate::Numeric(op, compile_operand(&format!("{at}.value"), p.get("value"), "NUMERIC", keys)?)
        }
        "BOOLEAN" => {
            let eq = match op()? {
                "EQUAL" => true,
                "NOT_EQUAL" => false,
                other => return err(at, format!("'{other}' is not a boolean operation (EQUAL, NOT_EQUAL)")),
            };
            Predicate::Boolean(eq, compile_operand(&format!("{at}.value"), p.get("value"), "BOOLEAN", keys)?)
        }
        "STRING" => {
            let op = match op()? {
                "EQUAL" => TextOp::Eq,
                "NOT_EQUAL" => TextOp::Ne,
                "STARTS_WITH" => TextOp::StartsWith,
                "ENDS_WITH" => TextOp::EndsWith,
                "CONTAINS" => TextOp::Contains,
                "NOT_CONTAINS" => TextOp::NotContains,
                "IN" => TextOp::In,
                "NOT_IN" => TextOp::NotIn,
                other => return err(at, format!("'{other}' is not a string operation")),
            };
            let ignore_case = p.get("ignoreCase").and_then(J::as_bool).unwrap_or(false);
            Predicate::Text(op, compile_operand(&format!("{at}.value"), p.get("value"), "STRING", keys)?, ignore_case)
        }
        "COMPLEX" => {
            let and = match op()? {
                "AND" => true,
                "OR" => false,
                other => return err(at, format!("'{other}' is not AND or OR")),
            };
            let list = match p.get("predicates") {
                Some(J::Array(l)) if !l.is_empty() => l,
                _ => return err(at, "a COMPLEX predicate needs a non-empty 'predicates' list"),
            };
            let preds = list
                .iter()
                .enumerate()
                .map(|(i, q)| compile_predicate(&format!("{at}.predicates[{i}]"), q, value_type, keys))
                .collect::<Result<_, _>>()?;
            Predicate::Complex(and, preds)
        }
        other => return err(at, format!("type '{other}' is not NUMERIC, BOOLEAN, STRING or COMPLEX")),
    })
}

/// A `FilterPredicateValue`: `defaultValue` (checked against `ty`), `dynamicValue`.
fn compile_operand(at: &str, v: Option<&J>, ty: &str, keys: &mut Vec<DataKey>) -> Result<Operand, RuleError> {
    let Some(v) = v.filter(|v| !v.is_null()) else { return err(at, "has no value") };
    let constant = v.get("defaultValue").filter(|c| !c.is_null()).cloned();
    if let Some(c) = &constant {
        let fits = match ty {
            "NUMERIC" => c.is_number(),
            "BOOLEAN" => c.is_boolean(),
            _ => c.is_string(),
        };
        if !fits {
            return err(at, format!("defaultValue {c} is not a {ty} value"));
        }
    }
    let dynamic = match v.get("dynamicValue") {
        Some(d) if d.get("sourceAttribute").and_then(J::as_str).is_some_and(|s| !s.is_empty()) => {
            let attr = str_field(at, d, "sourceAttribute")?.to_owned();
            let inherit = d.get("inherit").and_then(J::as_bool).unwrap_or(false);
            let chain = [DataKey::Attribute(attr.clone()), DataKey::Customer(attr.clone()), DataKey::Tenant(attr)];
            let from = match d.get("sourceType").and_then(J::as_str) {
                Some("CURRENT_DEVICE") => 0,
                Some("CURRENT_CUSTOMER") => 1,
                Some("CURRENT_TENANT") => 2,
                other => {
                    return err(
                        at,
                        format!(
                        "dynamicValue.sourceType {other:?} is not CURRENT_DEVICE, CURRENT_CUSTOMER or CURRENT_TENANT"
                    ),
                    )
                }
            };
            let to = if inherit { 3 } else { from + 1 };
            chain[from..to].iter().map(|k| slot(keys, k.clone())).collect()
        }
        _ => Vec::new(),
    };
    if constant.is_none() && dynamic.is_empty() {
        return err(at, "needs a defaultValue or a dynamicValue.sourceAttribute");
    }
    let constant = constant.map(|c| constant_value(at, &c)).transpose()?;
    Ok(Operand { constant, dynamic })
}

fn compile_spec(at: &str, s: Option<&J>, keys: &mut Vec<DataKey>) -> Result<Spec, RuleError> {
    let Some(s) = s.filter(|s| !s.is_null()) else { return Ok(Spec::Simple) };
    Ok(match s.get("type").and_then(J::as_str) {
        None | Some("SIMPLE") => Spec::Simple,
        Some("DURATION") => {
            let unit = match s.get("unit").and_then(J::as_str) {
                Some("MILLISECONDS") => 1,
                Some("SECONDS") => 1_000,
                Some("MINUTES") => 60_000,
                Some("HOURS") => 3_600_000,
                Some("DAYS") => 86_400_000,
                other => {
                    return err(at, format!("unit {other:?} is not MILLISECONDS, SECONDS, MINUTES, HOURS or DAYS"))
                }
            };
            Spec::Duration(unit, compile_operand(&format!("{at}.predicate"), s.get("predicate"), "NUMERIC", keys)?)
        }
        Some("REPEATING") => {
            Spec::Repeating(compile_operand(&format!("{at}.predicate"), s.get("predicate"), "NUMERIC", keys)?)
        }
        Some(other) => return err(at, format!("type '{other}' is not SIMPLE, DURATION or REPEATING")),
    })
}

fn compile_schedule(at: &str, s: Option<&J>) -> Result<Schedule, RuleError> {
    let Some(s) = s.filter(|s| !s.is_null()) else { return Ok(Schedule::AnyTime) };
    let tz = || {
        let name = s.get("timezone").and_then(J::as_str).unwrap_or("UTC");
        jiff::tz::TimeZone::get(name)
            .map_err(|_| RuleError { at: at.into(), what: format!("unknown timezone '{name}'") })
    };
    let ms = |v: Option<&J>| v.and_then(J::as_i64).unwrap_or(0);
    Ok(match s.get("type").and_then(J::as_str) {
        None | Some("ANY_TIME") => Schedule::AnyTime,
        Some("SPECIFIC_TIME") => {
            let days: Vec<u8> = match s.get("daysOfWeek") {
                Some(J::Array(d)) => {
                    d.iter().filter_map(J::as_u64).filter(|d| (1..=7).contains(d)).map(|d| d as u8).collect()
                }
                _ => Vec::new(),
            };
            Schedule::Specific { tz: tz()?, days, starts: ms(s.get("startsOn")), ends: ms(s.get("endsOn")) }
        }
        Some("CUSTOM") => {
            let mut days = [None; 7];
            for item in s.get("items").and_then(J::as_array).into_iter().flatten() {
                let day = item.get("dayOfWeek").and_then(J::as_u64).filter(|d| (1..=7).contains(d));
                if let (Some(d), Some(true)) = (day, item.get("enabled").and_then(J::as_bool)) {
                    days[d as usize - 1] = Some((ms(item.get("startsOn")), ms(item.get("endsOn"))));
                }
            }
            Schedule::Custom { tz: tz()?, days }
        }
        Some(other) => return err(at, format!("type '{other}' is not ANY_TIME, SPECIFIC_TIME or CUSTOM")),
    })
}

impl Rule {
    fn keys(&self, out: &mut Vec<KeyRef>) {
        let mut add = |k: &KeyRef| {
            if !out.contains(k) {
                out.push(k.clone());
            }
        };
        for f in &self.filters {
            if let Some(k) = &f.key {
                add(k);
            }
            f.predicate.operands(&mut |o| o.dynamic.iter().for_each(&mut add));
        }
        match &self.spec {
            Spec::Duration(_, o) | Spec::Repeating(o) => o.dynamic.iter().for_each(&mut add),
            Spec::Simple => {}
        }
    }

    /// Whether the rule's schedule includes `ts`.
    fn scheduled(&self, ts: i64) -> bool {
        let local = |tz: &jiff::tz::TimeZone| {
            let t = jiff::Timestamp::from_millisecond(ts).ok()?.to_zoned(tz.clone());
            let midnight = t.start_of_day().ok()?;
            let since = t.timestamp().as_millisecond() - midnight.timestamp().as_millisecond();
            Some((t.weekday().to_monday_one_offset() as u8, since))
        };
        // `endsOn` 0 is the end of the day; a start after the end is a window over midnight.
        let within = |starts: i64, ends: i64, at: i64| -> bool {
            let ends = if ends == 0 { 86_400_000 } else { ends };
            if starts <= ends {
                starts <= at && at < ends
            } else {
                at > starts || (0 < at && at < ends)
            }
        };
        match &self.schedule {
            Schedule::AnyTime => true,
            Schedule::Specific { tz, days, starts, ends } => local(tz)
                .is_some_and(|(day, at)| (days.len() >= 7 || days.contains(&day)) && within(*starts, *ends, at)),
            Schedule::Custom { tz, days } => {
                local(tz).is_some_and(|(day, at)| days[day as usize - 1].is_some_and(|(s, e)| within(s, e, at)))
            }
        }
    }

    /// Whether every filter holds on `data`.
    fn holds(&self, data: &dyn Snapshot) -> bool {
        self.filters.iter().all(|f| match (&f.key, &f.constant) {
            (Some(k), _) => data.get(k).is_some_and(|v| f.predicate.test(v, data, true)),
            // A constant is compared with dynamic values only (ThingsBoard's rule).
            (None, Some(c)) => f.predicate.test(c, data, false),
            (None, None) => false,
        })
    }

    /// The rendered details (`{"data": …}`, `dashboardId`), if the rule has any.
    pub fn details(&self, data: &dyn Snapshot) -> Option<J> {
        if self.details.is_none() && self.dashboard.is_none() {
            return None;
        }
        let mut out = serde_json::Map::new();
        if let Some(t) = &self.details {
            let mut text = t.clone();
            for k in self.filters.iter().filter_map(|f| f.key.as_ref()) {
                if let (Some(name), Some(v)) = (key_name(&k.key), data.get(k)) {
                    text = text.replace(&format!("${{{name}}}"), &v.to_display_string());
                }
            }
            out.insert("data".into(), J::String(text));
        }
        if let Some(d) = &self.dashboard {
            out.insert("dashboardId".into(), J::String(d.clone()));
        }
        Some(J::Object(out))
    }

    /// Evaluates the rule on a message at `ts`, updating its state.
    fn eval(&self, state: &mut RuleState, data: &dyn Snapshot, ts: i64) -> Eval {
        let true_now = self.scheduled(ts) && self.holds(data);
        if !true_now {
            return Eval::False;
        }
        match &self.spec {
            Spec::Simple => Eval::True,
            Spec::Repeating(n) => {
                state.events = state.events.saturating_add(1);
                let need = n.number(data).unwrap_or(1.0);
                if state.events as f64 >= need {
                    Eval::True
                } else {
                    Eval::NotYet
                }
            }
            Spec::Duration(unit, n) => {
                if state.last_ts > 0 {
                    if ts > state.last_ts {
                        // Saturating: a device's timestamps are its own to choose.
                        state.duration = state.duration.saturating_add(ts.saturating_sub(state.last_ts));
                        state.last_ts = ts;
                    }
                } else {
                    state.last_ts = ts;
                    state.duration = 0;
                }
                let need = n.number(data).map_or(0, |n| (n * *unit as f64) as i64);
                if need > 0 && state.duration > need {
                    Eval::True
                } else {
                    Eval::NotYet
                }
            }
        }
    }

    /// Re-evaluates a `DURATION` rule at `now` with no new message.
    fn eval_time(&self, state: &RuleState, data: &dyn Snapshot, now: i64) -> Eval {
        let Spec::Duration(unit, n) = &self.spec else { return Eval::NotYet };
        let need = n.number(data).map_or(0, |n| (n * *unit as f64) as i64);
        if need > 0 && state.last_ts > 0 && now > state.last_ts {
            if !self.scheduled(now) {
                return Eval::False;
            }
            if state.duration.saturating_add(now.saturating_sub(state.last_ts)) > need {
                return Eval::True;
            }
        }
        Eval::NotYet
    }
}

impl Predicate {
    fn operands(&self, f: &mut dyn FnMut(&Operand)) {
        match self {
            Predicate::Numeric(_, o) | Predicate::Boolean(_, o) | Predicate::Text(_, o, _) => f(o),
            Predicate::Complex(_, ps) => ps.iter().for_each(|p| p.operands(f)),
        }
    }

    /// Whether `v` passes; `defaults`: an operand whose attributes are missing falls back
    /// to its constant.
    fn test(&self, v: &Value, data: &dyn Snapshot, defaults: bool) -> bool {
        match self {
            Predicate::Numeric(op, o) => {
                let (Some(x), Some(y)) = (number(v), o.value(data, defaults).and_then(number)) else { return false };
                match op {
                    NumOp::Eq => x == y,
                    NumOp::Ne => x != y,
                    NumOp::Gt => x > y,
                    NumOp::Lt => x < y,
                    NumOp::Ge => x >= y,
                    NumOp::Le => x <= y,
                }
            }
            Predicate::Boolean(eq, o) => {
                let (Some(x), Some(y)) = (boolean(v), o.value(data, defaults).and_then(boolean)) else { return false };
                (x == y) == *eq
            }
            Predicate::Text(op, o, ignore_case) => {
                let Some(y) = o.value(data, defaults).map(|v| v.to_display_string()) else { return false };
                let x = v.to_display_string();
                let (x, y) = if *ignore_case { (x.to_lowercase(), y.to_lowercase()) } else { (x, y) };
                let listed = || list(&y).any(|item| item == x);
                match op {
                    TextOp::Eq => x == y,
                    TextOp::Ne => x != y,
                    TextOp::StartsWith => x.starts_with(&y),
                    TextOp::EndsWith => x.ends_with(&y),
                    TextOp::Contains => x.contains(&y),
                    TextOp::NotContains => !x.contains(&y),
                    TextOp::In => listed(),
                    TextOp::NotIn => !listed(),
                }
            }
            Predicate::Complex(true, ps) => ps.iter().all(|p| p.test(v, data, defaults)),
            Predicate::Complex(false, ps) => ps.iter().any(|p| p.test(v, data, defaults)),
        }
    }
}

/// The items of an `IN` list: split at commas, each trimmed, quotes taken off when every
/// item has the same.
fn list(s: &str) -> impl Iterator<Item = &str> {
    let items: Vec<&str> = s.split(',').map(str::trim).collect();
    let quoted = |q: char| items.iter().all(|i| i.len() >= 2 && i.starts_with(q) && i.ends_with(q));
    let strip = quoted('\'') || quoted('"');
    items.into_iter().map(move |i| if strip { &i[1..i.len() - 1] } else { i })
}

fn number(v: &Value) -> Option<f64> {
    match v {
        Value::Long(n) => Some(*n as f64),
        Value::Double(d) => Some(*d),
        Value::Str(s) => s.trim().parse().ok(),
        Value::Bool(b) => Some(f64::from(u8::from(*b))),
        Value::Json(_) => None,
    }
}

fn boolean(v: &Value) -> Option<bool> {
    match v {
        Value::Bool(b) => Some(*b),
        Value::Long(n) => Some(*n != 0),
        Value::Str(s) => s.trim().parse().ok(),
        _ => None,
    }
}

impl Operand {
    /// The first of its attributes that exists, else (with `defaults`) the constant.
    fn value<'a>(&'a self, data: &'a dyn Snapshot, defaults: bool) -> Option<&'a Value> {
        self.dynamic.iter().find_map(|k| data.get(k)).or(if defaults { self.constant.as_ref() } else { None })
    }
    fn number(&self, data: &dyn Snapshot) -> Option<f64> {
        self.value(data, true).and_then(number)
    }
}

/// What a device's data looks like now.
pub trait Snapshot {
    /// A key's current value.
    fn get(&self, key: &KeyRef) -> Option<&Value>;
}

/// By slot ([`KeyRef::slot`]): how the engine keeps a device's values.
impl Snapshot for Vec<Option<Value>> {
    fn get(&self, key: &KeyRef) -> Option<&Value> {
        self.as_slice().get(key.slot)?.as_ref()
    }
}

/// By key (the tests' snapshots; the engine's are by slot).
#[cfg(test)]
impl<S: std::hash::BuildHasher> Snapshot for std::collections::HashMap<DataKey, Value, S> {
    fn get(&self, key: &KeyRef) -> Option<&Value> {
        std::collections::HashMap::get(self, &key.key)
    }
}

/// One rule's progress (`DURATION`, `REPEATING`), as ThingsBoard persists it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuleState {
    /// Messages in a row the condition held in.
    #[serde(default, rename = "eventCount")]
    pub events: i64,
    /// The last such message's time.
    #[serde(default, rename = "lastEventTs")]
    pub last_ts: i64,
    /// How long it has held.
    #[serde(default)]
    pub duration: i64,
}

/// One alarm's rule states on one device: per create severity, and the clear rule. Plain
/// data (no allocation), compared in place to tell whether an evaluation changed it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AlarmState {
    /// Create rules' states, indexed by severity (`Severity as usize`); persisted as a map
    /// by severity name of those in progress, as ThingsBoard does.
    #[serde(default, with = "by_severity")]
    pub create: [RuleState; 5],
    /// The clear rule's state.
    #[serde(default)]
    pub clear: RuleState,
}

mod by_severity {
    use super::{RuleState, Severity};
    use serde::ser::SerializeMap;
    use serde::{Deserialize, Deserializer, Serializer};
    use std::collections::HashMap;

    pub fn serialize<S: Serializer>(states: &[RuleState; 5], s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        for sev in Severity::ALL {
            let state = &states[sev as usize];
            if *state != RuleState::default() {
                map.serialize_entry(&sev, state)?;
            }
        }
        map.end()
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[RuleState; 5], D::Error> {
        let mut out = [RuleState::default(); 5];
        for (sev, state) in HashMap::<Severity, RuleState>::deserialize(d)? {
            out[sev as usize] = state;
        }
        Ok(out)
    }
}

#[cfg(test)]
impl RuleState {
    /// An alarm state whose `MINOR` create rule is at this progress.
    fn into_alarm(self) -> AlarmState {
        let mut state = AlarmState::default();
        state.create[Severity::Minor as usize] = self;
        state
    }
}

/// A rule's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Eval {
    True,
    False,
    NotYet,
}

/// What to do with a device's alarm of one type.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Nothing.
    None,
    /// Raise it at this severity, or re-grade the active one; its details if the rule has any.
    Raise(Severity, Option<J>),
    /// Clear the active one; its details if the clear rule has any.
    Clear(Option<J>),
}

impl AlarmDef {
    /// Evaluates the alarm on a message at `ts` (`None`: a timer tick at `now`, for
    /// `DURATION` rules). `active`: whether the device has this alarm active. Returns the
    /// action and whether `state` changed.
    pub fn eval(
        &self,
        state: &mut AlarmState,
        data: &dyn Snapshot,
        ts: i64,
        tick: bool,
        active: bool,
    ) -> (Action, bool) {
        let before = *state;
        let mut raised = None;
        for (sev, rule) in &self.create {
            let s = &mut state.create[*sev as usize];
            let r = if tick { rule.eval_time(s, data, ts) } else { rule.eval(s, data, ts) };
            match r {
                Eval::True => {
                    raised = Some((*sev, rule));
                    break;
                }
                Eval::False => *s = RuleState::default(),
                Eval::NotYet => {}
            }
        }
        let action = if let Some((sev, rule)) = raised {
            state.clear = RuleState::default();
            Action::Raise(sev, rule.details(data))
        } else if let (true, Some(clear)) = (active, &self.clear) {
            let r = if tick { clear.eval_time(&state.clear, data, ts) } else { clear.eval(&mut state.clear, data, ts) };
            match r {
                Eval::True => {
                    *state = AlarmState::default();
                    Action::Clear(clear.details(data))
                }
                Eval::False => {
                    state.clear = RuleState::default();
                    Action::None
                }
                Eval::NotYet => Action::None,
            }
        } else {
            Action::None
        };
        (action, *state != before)
    }

    /// Whether a tick can change anything (a `DURATION` rule in progress).
    pub fn waits(&self, state: &AlarmState) -> bool {
        let pending = |r: &Rule, s: &RuleState| matches!(r.spec, Spec::Duration(..)) && s.last_ts > 0;
        self.create.iter().any(|(sev, r)| pending(r, &state.create[*sev as usize]))
            || self.clear.as_ref().is_some_and(|r| pending(r, &state.clear))
    }

    /// Whether a change of `key` concerns this alarm.
    pub fn reads(&self, key: &DataKey) -> bool {
        self.keys.iter().any(|k| k.key == *key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::collections::HashMap;

    fn num_filter(key: &str, op: &str, v: J) -> J {
        json!({"key": {"type": "TIME_SERIES", "key": key}, "valueType": "NUMERIC",
               "predicate": {"type": "NUMERIC", "operation": op, "value": {"defaultValue": v}}})
    }

    fn alarm(create: J, clear: J) -> AlarmDef {
        let a = json!([{"id": "a", "alarmType": "High temperature", "createRules": create, "clearRule": clear}]);
        ProfileAlarms::compile(Some(&a)).unwrap().alarms.remove(0)
    }

    fn snap(pairs: &[(&str, Value)]) -> HashMap<DataKey, Value> {
        pairs.iter().map(|(k, v)| (DataKey::Timeseries((*k).into()), v.clone())).collect()
    }

    #[test]
    fn severities_are_tried_from_the_highest_and_the_clear_rule_clears() {
        let a = alarm(
            json!({
                "MAJOR": {"condition": {"condition": [num_filter("t", "GREATER", json!(50))]}},
                "CRITICAL": {"condition": {"condition": [num_filter("t", "GREATER", json!(80))]},
                             "alarmDetails": "t = ${t}"},
            }),
            json!({"condition": {"condition": [num_filter("t", "LESS_OR_EQUAL", json!(50))]}}),
        );
        let mut s = AlarmState::default();
        assert_eq!(
            a.eval(&mut s, &snap(&[("t", Value::Long(60))]), 1, false, false).0,
            Action::Raise(Severity::Major, None)
        );
        assert_eq!(
            a.eval(&mut s, &snap(&[("t", Value::Double(90.5))]), 2, false, true).0,
            Action::Raise(Severity::Critical, Some(json!({"data": "t = 90.5"})))
        );
        assert_eq!(a.eval(&mut s, &snap(&[("t", Value::Long(40))]), 3, false, true).0, Action::Clear(None));
        // Nothing active: the clear rule is not looked at.
        assert_eq!(a.eval(&mut s, &snap(&[("t", Value::Long(40))]), 4, false, false).0, Action::None);
        // A missing key is false.
        assert_eq!(a.eval(&mut s, &snap(&[("x", Value::Long(99))]), 5, false, false).0, Action::None);
    }

    #[test]
    fn keys_get_one_slot_per_profile_and_slots_read_like_keys() {
        let dynamic = json!({"key": {"type": "TIME_SERIES", "key": "t"}, "valueType": "NUMERIC",
            "predicate": {"type": "NUMERIC", "operation": "GREATER", "value": {"defaultValue": 100,
                "dynamicValue": {"sourceType": "CURRENT_DEVICE", "sourceAttribute": "max"}}}});
        let a = json!([
            {"alarmType": "hot", "createRules": {"MAJOR": {"condition": {"condition": [dynamic]}}}},
            {"alarmType": "humid", "createRules": {"MINOR": {"condition": {"condition": [
                num_filter("h", "GREATER", json!(80)), num_filter("t", "GREATER", json!(0))]}}}},
        ]);
        let p = ProfileAlarms::compile(Some(&a)).unwrap();
        let slot = |k: DataKey| p.keys.iter().position(|x| *x == k).unwrap();
        let (t_slot, max_slot, h_slot) = (
            slot(DataKey::Timeseries("t".into())),
            slot(DataKey::Attribute("max".into())),
            slot(DataKey::Timeseries("h".into())),
        );
        assert_eq!(p.keys.len(), 3, "each key once: {:?}", p.keys);
        assert_eq!(p.timeseries["t"].key.slot, t_slot);
        assert_eq!(p.timeseries["t"].alarms, [0, 1]);
        assert_eq!(p.attributes["max"].key.slot, max_slot);
        // The same values by slot and by key decide the same.
        for (t, max) in [(50, None), (50, Some(40)), (150, None), (150, Some(200))] {
            let mut by_key = snap(&[("t", Value::Long(t)), ("h", Value::Long(90))]);
            let mut by_slot = vec![None; 3];
            by_slot[t_slot] = Some(Value::Long(t));
            by_slot[h_slot] = Some(Value::Long(90));
            if let Some(m) = max {
                by_key.insert(DataKey::Attribute("max".into()), Value::Long(m));
                by_slot[max_slot] = Some(Value::Long(m));
            }
            for alarm in &p.alarms {
                let key = alarm.eval(&mut AlarmState::default(), &by_key, 1, false, false);
                let slot = alarm.eval(&mut AlarmState::default(), &by_slot, 1, false, false);
                assert_eq!(key, slot, "{} at t={t} max={max:?}", alarm.alarm_type);
            }
            let hot = p.alarms[0].eval(&mut AlarmState::default(), &by_slot, 1, false, false).0;
            assert_eq!(hot != Action::None, t > max.unwrap_or(100), "t={t} max={max:?}");
        }
    }

    #[test]
    fn alarm_states_persist_as_a_map_by_severity() {
        let mut s = RuleState { events: 2, last_ts: 7, duration: 0 }.into_alarm();
        s.clear.events = 1;
        let doc = serde_json::to_value(s).unwrap();
        assert_eq!(
            doc,
            json!({"create": {"MINOR": {"eventCount": 2, "lastEventTs": 7, "duration": 0}},
                   "clear": {"eventCount": 1, "lastEventTs": 0, "duration": 0}})
        );
        assert_eq!(serde_json::from_value::<AlarmState>(doc).unwrap(), s);
        assert_eq!(serde_json::from_value::<AlarmState>(json!({})).unwrap(), AlarmState::default());
        assert!(serde_json::from_value::<AlarmState>(json!({"create": {"HIGH": {}}})).is_err());
    }

    #[test]
    fn repeating_and_duration_count_and_start_over() {
        let rep = alarm(
            json!({"WARNING": {"condition": {"condition": [num_filter("t", "GREATER", json!(10))],
                   "spec": {"type": "REPEATING", "predicate": {"defaultValue": 3}}}}}),
            J::Null,
        );
        let mut s = AlarmState::default();
        let hot = snap(&[("t", Value::Long(11))]);
        assert_eq!(rep.eval(&mut s, &hot, 1, false, false), (Action::None, true));
        assert_eq!(rep.eval(&mut s, &hot, 2, false, false).0, Action::None);
        assert_eq!(rep.eval(&mut s, &snap(&[("t", Value::Long(1))]), 3, false, false), (Action::None, true));
        assert_eq!(s, AlarmState::default(), "a false message starts the count over");
        for ts in 4..6 {
            assert_eq!(rep.eval(&mut s, &hot, ts, false, false).0, Action::None);
        }
        assert_eq!(rep.eval(&mut s, &hot, 6, false, false).0, Action::Raise(Severity::Warning, None));

        let dur = alarm(
            json!({"MINOR": {"condition": {"condition": [num_filter("t", "GREATER", json!(10))],
                   "spec": {"type": "DURATION", "unit": "SECONDS", "predicate": {"defaultValue": 5}}}}}),
            J::Null,
        );
        let mut s = AlarmState::default();
        assert_eq!(dur.eval(&mut s, &hot, 1_000, false, false).0, Action::None);
        assert!(dur.waits(&s));
        assert_eq!(dur.eval(&mut s, &hot, 4_000, false, false).0, Action::None);
        // No message for a while: the timer raises it.
        assert_eq!(dur.eval(&mut s, &hot, 5_000, true, false).0, Action::None);
        assert_eq!(dur.eval(&mut s, &hot, 6_001, true, false).0, Action::Raise(Severity::Minor, None));
        // A device's extreme timestamps saturate instead of overflowing.
        let mut s = AlarmState::default();
        for ts in [1, i64::MAX - 1, i64::MAX] {
            dur.eval(&mut s, &hot, ts, false, false);
        }
        let mut s = RuleState { duration: i64::MAX - 1, last_ts: 1, ..Default::default() }.into_alarm();
        assert!(matches!(dur.eval(&mut s, &hot, i64::MAX, true, false).0, Action::Raise(..)));
    }

    #[test]
    fn dynamic_thresholds_fall_back_to_the_constant_and_customers_inherit() {
        let f = json!({"key": {"type": "TIME_SERIES", "key": "t"}, "valueType": "NUMERIC",
            "predicate": {"type": "NUMERIC", "operation": "GREATER", "value": {"defaultValue": 100,
                "dynamicValue": {"sourceType": "CURRENT_CUSTOMER", "sourceAttribute": "max", "inherit": true}}}});
        let a = alarm(json!({"MAJOR": {"condition": {"condition": [f]}}}), J::Null);
        assert!(a.reads(&DataKey::Customer("max".into())) && a.reads(&DataKey::Tenant("max".into())));
        assert!(!a.reads(&DataKey::Attribute("max".into())), "a customer's value does not look at the device");
        let mut s = AlarmState::default();
        let mut d = snap(&[("t", Value::Long(50))]);
        assert_eq!(a.eval(&mut s, &d, 1, false, false).0, Action::None, "50 > the default 100 is false");
        d.insert(DataKey::Tenant("max".into()), Value::Long(40));
        assert_eq!(a.eval(&mut s, &d, 2, false, false).0, Action::Raise(Severity::Major, None), "the tenant's 40");
        d.insert(DataKey::Customer("max".into()), Value::Long(60));
        assert_eq!(a.eval(&mut s, &d, 3, false, false).0, Action::None, "the customer's 60 first");
    }

    #[test]
    fn strings_booleans_and_complex_predicates() {
        let text = |op: &str, v: &str, ic: bool| {
            json!({"key": {"type": "ATTRIBUTE", "key": "mode"}, "valueType": "STRING",
                "predicate": {"type": "STRING", "operation": op, "value": {"defaultValue": v}, "ignoreCase": ic}})
        };
        let attr = |v: &str| -> HashMap<DataKey, Value> {
            [(DataKey::Attribute("mode".into()), Value::Str(v.into()))].into_iter().collect()
        };
        for (op, v, ic, input, want) in [
            ("EQUAL", "Eco", true, "eco", true),
            ("EQUAL", "Eco", false, "eco", false),
            ("STARTS_WITH", "ec", false, "eco", true),
            ("ENDS_WITH", "co", false, "eco", true),
            ("CONTAINS", "x", false, "eco", false),
            ("NOT_CONTAINS", "x", false, "eco", true),
            ("IN", "off, eco", false, "eco", true),
            ("IN", "'off', 'eco'", false, "eco", true),
            ("NOT_IN", "off,eco", false, "eco", false),
            ("NOT_EQUAL", "eco", false, "eco", false),
        ] {
            let a = alarm(json!({"MINOR": {"condition": {"condition": [text(op, v, ic)]}}}), J::Null);
            let got = a.eval(&mut AlarmState::default(), &attr(input), 1, false, false).0 != Action::None;
            assert_eq!(got, want, "{op} {v:?} on {input:?}");
        }
        let b = json!({"key": {"type": "TIME_SERIES", "key": "door"}, "valueType": "BOOLEAN",
            "predicate": {"type": "BOOLEAN", "operation": "EQUAL", "value": {"defaultValue": true}}});
        let c = json!({"key": {"type": "TIME_SERIES", "key": "t"}, "valueType": "NUMERIC",
            "predicate": {"type": "COMPLEX", "operation": "OR", "predicates": [
                {"type": "NUMERIC", "operation": "LESS", "value": {"defaultValue": 0}},
                {"type": "NUMERIC", "operation": "GREATER", "value": {"defaultValue": 30}}]}});
        let a = alarm(json!({"MAJOR": {"condition": {"condition": [b, c]}}}), J::Null);
        let run = |door: bool, t: i64| {
            a.eval(
                &mut AlarmState::default(),
                &snap(&[("door", Value::Bool(door)), ("t", Value::Long(t))]),
                1,
                false,
                false,
            )
            .0 != Action::None
        };
        assert!(run(true, -5) && run(true, 35));
        assert!(!run(true, 20) && !run(false, 35));
    }

    #[test]
    fn schedules_follow_the_time_zone() {
        // 2026-11-30 is a Monday. 08:00 UTC is 10:00 in Kyiv (UTC+2 in winter).
        let monday_8_utc = 1_796_025_600_000;
        let rule = |sched: J| {
            alarm(
                json!({"MAJOR": {"condition": {"condition": [num_filter("t", "GREATER", json!(1))]}, "schedule": sched}}),
                J::Null,
            )
        };
        let hot = snap(&[("t", Value::Long(5))]);
        let fires =
            |a: &AlarmDef| a.eval(&mut AlarmState::default(), &hot, monday_8_utc, false, false).0 != Action::None;
        let hour = 3_600_000;
        let kyiv = |days: J, s: i64, e: i64| {
            rule(
                json!({"type": "SPECIFIC_TIME", "timezone": "Europe/Kyiv", "daysOfWeek": days, "startsOn": s, "endsOn": e}),
            )
        };
        assert!(fires(&kyiv(json!([1]), 9 * hour, 11 * hour)));
        assert!(!fires(&kyiv(json!([1]), 7 * hour, 9 * hour)), "09:00 Kyiv time is over");
        assert!(!fires(&kyiv(json!([2, 3]), 9 * hour, 11 * hour)), "not on Monday");
        assert!(fires(&kyiv(json!([1]), 22 * hour, 11 * hour)), "over midnight");
        assert!(fires(&kyiv(json!([1]), 9 * hour, 0)), "0 ends at midnight");
        assert!(fires(&kyiv(json!([1, 2, 3, 4, 5, 6, 7]), 9 * hour, 0)), "every day");
        let custom = rule(json!({"type": "CUSTOM", "timezone": "UTC", "items": [
            {"dayOfWeek": 1, "enabled": true, "startsOn": 8 * hour, "endsOn": 9 * hour},
            {"dayOfWeek": 2, "enabled": false, "startsOn": 0, "endsOn": 0}]}));
        assert!(fires(&custom));
        assert!(fires(&rule(json!({"type": "ANY_TIME"}))));
    }

    #[test]
    fn bad_rules_are_refused_naming_where() {
        let bad = |create: J, what: &str| {
            let a = json!([{"alarmType": "x", "createRules": create}]);
            let e = ProfileAlarms::compile(Some(&a)).unwrap_err();
            assert!(e.to_string().contains(what), "{e} should say {what}");
        };
        let wrong_type = json!({"key": {"type": "TIME_SERIES", "key": "t"}, "valueType": "NUMERIC",
            "predicate": {"type": "STRING", "operation": "EQUAL", "value": {"defaultValue": "a"}}});
        bad(
            json!({"MAJOR": {"condition": {"condition": [wrong_type]}}}),
            "a STRING predicate cannot test a NUMERIC value",
        );
        let no_key = json!({"key": {"type": "TIME_SERIES"}, "valueType": "NUMERIC",
            "predicate": {"type": "NUMERIC", "operation": "GREATER", "value": {"defaultValue": 1}}});
        bad(json!({"MAJOR": {"condition": {"condition": [no_key]}}}), "'key' must be a non-empty string");
        let text_threshold = num_filter("t", "GREATER", json!("hot"));
        bad(json!({"MAJOR": {"condition": {"condition": [text_threshold]}}}), "is not a NUMERIC value");
        bad(
            json!({"MAJOR": {"condition": {"condition": [num_filter("t", "GREATER", json!(1))]}, "alarmDetails": "${humidity}"}}),
            "'${humidity}' is not a key of this rule's condition",
        );
        bad(json!({"HIGH": {"condition": {"condition": [num_filter("t", "GREATER", json!(1))]}}}), "is not a severity");
        bad(
            json!({"MAJOR": {"condition": {"condition": [num_filter("t", "GREATER", json!(1))]},
                "schedule": {"type": "SPECIFIC_TIME", "timezone": "Mars/Olympus"}}}),
            "unknown timezone",
        );
        bad(json!([]), "'createRules' is an object of rules by severity");
        let no_type = json!([{"createRules": {}}]);
        assert!(ProfileAlarms::compile(Some(&no_type))
            .unwrap_err()
            .to_string()
            .contains("Alarm rule type should be specified!"));
        let twice = json!([{"alarmType": "x"}, {"alarmType": "x"}]);
        assert!(ProfileAlarms::compile(Some(&twice))
            .unwrap_err()
            .to_string()
            .contains("the same alarm rule types: \"x\""));
    }
}
