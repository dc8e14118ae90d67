//! ThingsBoard's entity query key filters, sans-IO: `keyFilters` of an entity data or count
//! query (`[{"key": {"type", "key"}, "valueType", "predicate"}]`, all of which must hold)
//! read from JSON ([`parse`]) and checked against a value ([`Predicate::matches`]).
//!
//! Predicates, as ThingsBoard has them:
//! - `NUMERIC`: `EQUAL`, `NOT_EQUAL`, `GREATER`, `LESS`, `GREATER_OR_EQUAL`,
//!   `LESS_OR_EQUAL`; a text value is read as a number, and one that is none never matches;
//! - `STRING`: `EQUAL`, `NOT_EQUAL`, `STARTS_WITH`, `ENDS_WITH`, `CONTAINS`,
//!   `NOT_CONTAINS`, `IN`, `NOT_IN` (a comma-separated list), `ignoreCase`; any value is
//!   compared as its text;
//! - `BOOLEAN`: `EQUAL`, `NOT_EQUAL`;
//! - `COMPLEX`: `AND` or `OR` of nested predicates.
//!
//! An entity without the key matches no predicate, `NOT_EQUAL` included (as SQL's `NULL`
//! compares in ThingsBoard). Only constant values (`value.defaultValue`) are served; a
//! dynamic value (`value.dynamicValue.sourceType`: the current user's, customer's or
//! tenant's attribute) is refused with a clear error.

use gridlinks_types::Value;
use serde::Deserialize;
use serde_json::Value as J;

use crate::ws::{EntityKey, KeyType};

/// Most key filters in a query.
pub const MAX_FILTERS: usize = 32;
/// Deepest nesting of `COMPLEX` predicates.
pub const MAX_DEPTH: usize = 4;
/// Most predicates inside one `COMPLEX` predicate.
pub const MAX_NESTED: usize = 32;

/// One key filter: the key whose value it checks, and the check.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyFilter {
    /// The entity field, attribute or latest time-series value checked.
    pub key: EntityKey,
    /// The check.
    pub predicate: Predicate,
}

/// A comparison of numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NumericOp {
    /// `EQUAL`.
    Equal,
    /// `NOT_EQUAL`.
    NotEqual,
    /// `GREATER`.
    Greater,
    /// `LESS`.
    Less,
    /// `GREATER_OR_EQUAL`.
    GreaterOrEqual,
    /// `LESS_OR_EQUAL`.
    LessOrEqual,
}

/// A comparison of texts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StringOp {
    /// `EQUAL`.
    Equal,
    /// `NOT_EQUAL`.
    NotEqual,
    /// `STARTS_WITH`.
    StartsWith,
    /// `ENDS_WITH`.
    EndsWith,
    /// `CONTAINS`.
    Contains,
    /// `NOT_CONTAINS`.
    NotContains,
    /// `IN`: one of a comma-separated list.
    In,
    /// `NOT_IN`.
    NotIn,
}

/// A key filter's check.
#[derive(Debug, Clone, PartialEq)]
pub enum Predicate {
    /// `NUMERIC`.
    Numeric(NumericOp, f64),
    /// `STRING`: the operation, the text, and whether case is ignored.
    String(StringOp, String, bool),
    /// `BOOLEAN`: whether the value must equal (`true`) or differ from (`false`) the flag.
    Boolean(bool, bool),
    /// `COMPLEX`: all (`true`) or any (`false`) of the predicates.
    Complex(bool, Vec<Predicate>),
}

impl Predicate {
    /// Whether `value` (`None`: the entity has no such key) passes.
    pub fn matches(&self, value: Option<&Value>) -> bool {
        let Some(value) = value else { return false };
        match self {
            Predicate::Numeric(op, x) => {
                let v = match value {
                    Value::Long(l) => *l as f64,
                    Value::Double(d) => *d,
                    Value::Str(s) => match s.trim().parse::<f64>() {
                        Ok(d) if d.is_finite() => d,
                        _ => return false,
                    },
                    Value::Bool(_) | Value::Json(_) => return false,
                };
                match op {
                    NumericOp::Equal => v == *x,
                    NumericOp::NotEqual => v != *x,
                    NumericOp::Greater => v > *x,
                    NumericOp::Less => v < *x,
                    NumericOp::GreaterOrEqual => v >= *x,
                    NumericOp::LessOrEqual => v <= *x,
                }
            }
            Predicate::String(op, x, ignore_case) => {
                let text = value.to_display_string();
                let (v, x) = if *ignore_case { (text.to_lowercase(), x.to_lowercase()) } else { (text, x.clone()) };
                let listed = || x.split(',').any(|item| item.trim() == v);
                match op {
                    StringOp::Equal => v == x,
                    StringOp::NotEqual => v != x,
                    StringOp::StartsWith => v.starts_with(&x),
                    StringOp::EndsWith => v.ends_with(&x),
                    StringOp::Contains => v.contains(&x),
                    StringOp::NotContains => !v.contains(&x),
                    StringOp::In => listed(),
                    StringOp::NotIn => !listed(),
                }
            }
            Predicate::Boolean(equal, x) => {
                let v = match value {
                    Value::Bool(b) => *b,
                    Value::Str(s) if s.eq_ignore_ascii_case("true") => true,
                    Value::Str(s) if s.eq_ignore_ascii_case("false") => false,
                    _ => return false,
                };
                (v == *x) == *equal
            }
            Predicate::Complex(all, nested) => {
                if *all {
                    nested.iter().all(|p| p.matches(Some(value)))
                } else {
                    nested.iter().any(|p| p.matches(Some(value)))
                }
            }
        }
    }
}

#[derive(Deserialize)]
struct RawFilter {
    key: RawKey,
    predicate: J,
}

#[derive(Deserialize)]
struct RawKey {
    #[serde(rename = "type")]
    key_type: String,
    key: String,
}

/// Reads a query's `keyFilters` (absent or `null`: none).
pub fn parse(filters: Option<J>) -> Result<Vec<KeyFilter>, String> {
    let list: Vec<RawFilter> = match filters {
        None | Some(J::Null) => return Ok(Vec::new()),
        Some(f) => serde_json::from_value(f).map_err(|e| format!("keyFilters: {e}"))?,
    };
    if list.len() > MAX_FILTERS {
        return Err(format!("keyFilters: at most {MAX_FILTERS}"));
    }
    list.into_iter()
        .map(|f| {
            let key = EntityKey { key_type: KeyType::parse(&f.key.key_type)?, key: f.key.key };
            let predicate = predicate(&f.predicate, 0).map_err(|e| format!("keyFilters[{}]: {e}", key.key))?;
            Ok(KeyFilter { key, predicate })
        })
        .collect()
}

fn predicate(p: &J, depth: usize) -> Result<Predicate, String> {
    let text = |field: &str| p.get(field).and_then(J::as_str).ok_or(format!("predicate without {field}"));
    let op = text("operation")?;
    Ok(match text("type")? {
        "NUMERIC" => {
            let op = match op {
                "EQUAL" => NumericOp::Equal,
                "NOT_EQUAL" => NumericOp::NotEqual,
                "GREATER" => NumericOp::Greater,
                "LESS" => NumericOp::Less,
                "GREATER_OR_EQUAL" => NumericOp::GreaterOrEqual,
                "LESS_OR_EQUAL" => NumericOp::LessOrEqual,
                _ => return Err(format!("NUMERIC operation {op:?} is not one of ThingsBoard's")),
            };
            let v = constant(p)?;
            let x = v.as_f64().or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()));
            Predicate::Numeric(op, x.filter(|x| x.is_finite()).ok_or("a NUMERIC predicate's value must be a number")?)
        }
        "STRING" => {
            let op = match op {
                "EQUAL" => StringOp::Equal,
                "NOT_EQUAL" => StringOp::NotEqual,
                "STARTS_WITH" => StringOp::StartsWith,
                "ENDS_WITH" => StringOp::EndsWith,
                "CONTAINS" => StringOp::Contains,
                "NOT_CONTAINS" => StringOp::NotContains,
                "IN" => StringOp::In,
                "NOT_IN" => StringOp::NotIn,
                _ => return Err(format!("STRING operation {op:?} is not one of ThingsBoard's")),
            };
            let v = constant(p)?;
            let x = match v {
                J::String(s) => s.clone(),
                J::Number(n) => n.to_string(),
                J::Bool(b) => b.to_string(),
                _ => return Err("a STRING predicate's value must be text".into()),
            };
            Predicate::String(op, x, p.get("ignoreCase").and_then(J::as_bool).unwrap_or(false))
        }
        "BOOLEAN" => {
            let equal = match op {
                "EQUAL" => true,
                "NOT_EQUAL" => false,
                _ => return Err(format!("BOOLEAN operation {op:?} is not one of ThingsBoard's")),
            };
            let v = constant(p)?;
            let x = v.as_bool().or_else(|| v.as_str().and_then(|s| s.parse().ok()));
            Predicate::Boolean(equal, x.ok_or("a BOOLEAN predicate's value must be true or false")?)
        }
        "COMPLEX" => {
            let all = match op {
                "AND" => true,
                "OR" => false,
                _ => return Err(format!("COMPLEX operation {op:?}: AND or OR")),
            };
            if depth >= MAX_DEPTH {
                return Err(format!("COMPLEX predicates nest at most {MAX_DEPTH} deep"));
            }
            let nested = p.get("predicates").and_then(J::as_array).ok_or("COMPLEX predicate without predicates")?;
            if nested.len() > MAX_NESTED {
                return Err(format!("a COMPLEX predicate holds at most {MAX_NESTED} predicates"));
            }
            Predicate::Complex(all, nested.iter().map(|n| predicate(n, depth + 1)).collect::<Result<_, _>>()?)
        }
        other => return Err(format!("predicate type {other:?}: NUMERIC, STRING, BOOLEAN or COMPLEX")),
    })
}

/// A predicate's constant: `value.defaultValue`. A dynamic value is refused.
fn constant(p: &J) -> Result<&J, String> {
    let v = p.get("value").ok_or("predicate without value")?;
    let dynamic = v.get("dynamicValue").and_then(|d| d.get("sourceType")).is_some_and(|s| !s.is_null());
    if dynamic {
        return Err("dynamic predicate values (dynamicValue.sourceType) are not served; give defaultValue".into());
    }
    match v.get("defaultValue") {
        Some(d) if !d.is_null() => Ok(d),
        _ => Err("predicate without value.defaultValue".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn one(predicate: J) -> Result<Predicate, String> {
        let f = parse(Some(
            json!([{"key": {"type": "TIME_SERIES", "key": "t"}, "valueType": "NUMERIC", "predicate": predicate}]),
        ))?;
        Ok(f[0].predicate.clone())
    }

    fn num(op: &str, v: J) -> J {
        json!({"type": "NUMERIC", "operation": op, "value": {"defaultValue": v, "dynamicValue": null}})
    }

    #[test]
    fn numeric_predicates_compare_numbers_and_numeric_text() {
        let gt = one(num("GREATER", json!(20))).unwrap();
        assert!(gt.matches(Some(&Value::Double(20.5))));
        assert!(gt.matches(Some(&Value::Str(" 21 ".into()))));
        assert!(!gt.matches(Some(&Value::Long(20))));
        assert!(!gt.matches(Some(&Value::Str("hot".into()))));
        assert!(!gt.matches(Some(&Value::Bool(true))));
        assert!(!gt.matches(None));
        let ne = one(num("NOT_EQUAL", json!("5"))).unwrap();
        assert!(ne.matches(Some(&Value::Long(4))) && !ne.matches(Some(&Value::Long(5))) && !ne.matches(None));
        for (op, v, want) in
            [("EQUAL", 5, true), ("LESS", 6, true), ("GREATER_OR_EQUAL", 5, true), ("LESS_OR_EQUAL", 4, false)]
        {
            assert_eq!(one(num(op, json!(v))).unwrap().matches(Some(&Value::Long(5))), want, "{op} {v}");
        }
    }

    #[test]
    fn string_predicates_compare_text_with_or_without_case() {
        let s = |op: &str, v: &str, ic: bool| {
            one(json!({"type": "STRING", "operation": op, "value": {"defaultValue": v}, "ignoreCase": ic})).unwrap()
        };
        let v = Value::Str("Floor-1 East".into());
        assert!(s("STARTS_WITH", "floor", true).matches(Some(&v)));
        assert!(!s("STARTS_WITH", "floor", false).matches(Some(&v)));
        assert!(s("ENDS_WITH", "East", false).matches(Some(&v)));
        assert!(s("CONTAINS", "-1", false).matches(Some(&v)));
        assert!(!s("NOT_CONTAINS", "-1", false).matches(Some(&v)));
        assert!(s("IN", "a, floor-1 east ,b", true).matches(Some(&v)));
        assert!(!s("NOT_IN", "a,Floor-1 East", false).matches(Some(&v)));
        assert!(s("EQUAL", "42", false).matches(Some(&Value::Long(42))));
        assert!(!s("NOT_EQUAL", "x", false).matches(None));
    }

    #[test]
    fn boolean_and_complex_predicates() {
        let b = one(json!({"type": "BOOLEAN", "operation": "EQUAL", "value": {"defaultValue": true}})).unwrap();
        assert!(b.matches(Some(&Value::Bool(true))) && b.matches(Some(&Value::Str("TRUE".into()))));
        assert!(!b.matches(Some(&Value::Bool(false))) && !b.matches(Some(&Value::Long(1))));
        let between = one(json!({"type": "COMPLEX", "operation": "AND", "predicates": [num("GREATER", json!(10)), num("LESS", json!(20))]})).unwrap();
        assert!(between.matches(Some(&Value::Long(15))) && !between.matches(Some(&Value::Long(25))));
        let outside = one(json!({"type": "COMPLEX", "operation": "OR", "predicates": [num("LESS", json!(10)), num("GREATER", json!(20))]})).unwrap();
        assert!(outside.matches(Some(&Value::Long(25))) && !outside.matches(Some(&Value::Long(15))));
    }

    #[test]
    fn bad_filters_are_refused_with_the_reason() {
        let e = |p: J| one(p).unwrap_err();
        assert!(e(num("BIGGER", json!(1))).contains("BIGGER"));
        assert!(e(num("EQUAL", json!("x"))).contains("must be a number"));
        assert!(e(json!({"type": "NUMERIC", "operation": "EQUAL", "value": {"defaultValue": 1, "dynamicValue": {"sourceType": "CURRENT_USER", "sourceAttribute": "max"}}})).contains("dynamic"));
        assert!(e(json!({"type": "NUMERIC", "operation": "EQUAL"})).contains("without value"));
        assert!(e(json!({"type": "REGEX", "operation": "EQUAL", "value": {"defaultValue": 1}})).contains("REGEX"));
        let mut deep = num("EQUAL", json!(1));
        for _ in 0..=MAX_DEPTH {
            deep = json!({"type": "COMPLEX", "operation": "AND", "predicates": [deep]});
        }
        assert!(e(deep).contains("nest"));
        let many = vec![
            json!({"key": {"type": "TIME_SERIES", "key": "t"}, "predicate": num("EQUAL", json!(1))});
            MAX_FILTERS + 1
        ];
        assert!(parse(Some(J::Array(many))).unwrap_err().contains("at most"));
        assert!(
            parse(Some(json!([{"key": {"type": "NOPE", "key": "t"}, "predicate": num("EQUAL", json!(1))}]))).is_err()
        );
        assert_eq!(parse(None), Ok(Vec::new()));
    }
}
