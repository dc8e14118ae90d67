//! ThingsBoard's WebSocket telemetry commands and updates, sans-IO: what a message from a
//! client asks ([`parse`]) and the JSON of an update ([`update`], [`error`]).
//!
//! Two forms of the same commands are read:
//! - `/api/ws`: `{"authCmd": {"cmdId", "token"}, "cmds": [{"cmdId", "type": "TIMESERIES" |
//!   "TIMESERIES_HISTORY" | "ATTRIBUTES" | …, "entityType", "entityId", "keys", …}]}`;
//! - the older `/api/ws/plugins/telemetry`: `{"tsSubCmds": […], "historyCmds": […],
//!   "attrSubCmds": […]}`.
//!
//! An update is `{"subscriptionId", "errorCode", "errorMsg", "data": {"key": [[ts, "value"]]},
//! "latestValues": {"key": ts}}`, values as text, as ThingsBoard sends them.

use serde::Deserialize;
use serde_json::{json, Map, Value as J};

/// ThingsBoard's WebSocket error codes.
pub mod code {
    /// Success.
    pub const NO_ERROR: u8 = 0;
    /// Internal error.
    pub const INTERNAL_ERROR: u8 = 1;
    /// Invalid command or parameters.
    pub const BAD_REQUEST: u8 = 2;
    /// Missing or invalid authentication, or no permission.
    pub const UNAUTHORIZED: u8 = 3;
}

/// One command of a message.
#[derive(Debug, Clone, PartialEq)]
pub enum Cmd {
    /// Latest values of a device's keys, then every committed change (with `history`, the
    /// window's points first).
    Subscribe(TsSub),
    /// Points of a device's keys in a window, once.
    History(HistoryCmd),
    /// A device's attributes (of one scope, or all), then every committed change.
    Attributes(AttrSub),
    /// Ends subscription `cmdId`.
    Unsubscribe(i64),
    /// A command this server does not serve (its `cmdId` and why).
    Unsupported(i64, String),
}

/// A time-series subscription.
#[derive(Debug, Clone, PartialEq)]
pub struct TsSub {
    /// The client's id for it (the updates' `subscriptionId`).
    pub cmd_id: i64,
    /// The entity: `DEVICE` and its id (anything else is refused by the server).
    pub entity_type: String,
    /// Its id.
    pub entity_id: String,
    /// Keys; `None`: all.
    pub keys: Option<Vec<String>>,
    /// With a time window: `(startTs, limit)`, the points since `startTs` first.
    pub history: Option<(i64, usize)>,
}

/// An attribute subscription.
#[derive(Debug, Clone, PartialEq)]
pub struct AttrSub {
    /// The client's id for it.
    pub cmd_id: i64,
    /// Entity type (`DEVICE`).
    pub entity_type: String,
    /// Entity id.
    pub entity_id: String,
    /// Keys; `None`: all.
    pub keys: Option<Vec<String>>,
    /// `CLIENT_SCOPE`, `SERVER_SCOPE` or `SHARED_SCOPE`; `None`: all three.
    pub scope: Option<String>,
}

/// A one-off history query.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryCmd {
    /// The client's id for it.
    pub cmd_id: i64,
    /// Entity type (`DEVICE`).
    pub entity_type: String,
    /// Entity id.
    pub entity_id: String,
    /// Keys (at least one).
    pub keys: Vec<String>,
    /// Window start, ms.
    pub start_ts: i64,
    /// Window end, ms.
    pub end_ts: i64,
    /// Most points per key.
    pub limit: usize,
}

/// A message: its authentication (`cmdId`, token), if any, and its commands.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Message {
    /// `authCmd`.
    pub auth: Option<(i64, String)>,
    /// The commands, in order.
    pub cmds: Vec<Cmd>,
}

/// Most points a subscription's window or a history command returns per key.
pub const MAX_LIMIT: usize = 10_000;
/// Points per key when a command gives no `limit` (ThingsBoard's default).
pub const DEFAULT_LIMIT: usize = 100;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawMessage {
    auth_cmd: Option<RawAuth>,
    #[serde(default)]
    cmds: Vec<RawCmd>,
    #[serde(default)]
    ts_sub_cmds: Vec<RawCmd>,
    #[serde(default)]
    history_cmds: Vec<RawCmd>,
    #[serde(default)]
    attr_sub_cmds: Vec<RawCmd>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawAuth {
    cmd_id: Option<i64>,
    token: String,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct RawCmd {
    cmd_id: i64,
    #[serde(rename = "type")]
    cmd_type: Option<String>,
    entity_type: Option<String>,
    entity_id: Option<String>,
    keys: Option<String>,
    scope: Option<String>,
    start_ts: Option<i64>,
    end_ts: Option<i64>,
    time_window: Option<i64>,
    limit: Option<i64>,
    agg: Option<String>,
    #[serde(default)]
    unsubscribe: bool,
}

fn keys(s: Option<&str>) -> Option<Vec<String>> {
    let list: Vec<String> = s?.split(',').map(str::trim).filter(|k| !k.is_empty()).map(str::to_owned).collect();
    (!list.is_empty()).then_some(list)
}

fn limit(l: Option<i64>) -> usize {
    l.map_or(DEFAULT_LIMIT, |l| usize::try_from(l).unwrap_or(0)).clamp(1, MAX_LIMIT)
}

fn entity(c: &RawCmd) -> Result<(String, String), Cmd> {
    match (&c.entity_type, &c.entity_id) {
        (Some(t), Some(id)) => Ok((t.clone(), id.clone())),
        _ => Err(Cmd::Unsupported(c.cmd_id, "entityType and entityId are required".into())),
    }
}

fn subscription(c: RawCmd, now: i64) -> Cmd {
    if c.unsubscribe {
        return Cmd::Unsubscribe(c.cmd_id);
    }
    if c.scope.as_deref().is_some_and(|s| s != "LATEST_TELEMETRY") {
        return Cmd::Unsupported(c.cmd_id, format!("scope {:?}: only LATEST_TELEMETRY", c.scope.unwrap_or_default()));
    }
    let (entity_type, entity_id) = match entity(&c) {
        Ok(e) => e,
        Err(e) => return e,
    };
    let start = c.start_ts.or(c.time_window.map(|w| now.saturating_sub(w)));
    Cmd::Subscribe(TsSub {
        cmd_id: c.cmd_id,
        entity_type,
        entity_id,
        keys: keys(c.keys.as_deref()),
        history: start.map(|s| (s, limit(c.limit))),
    })
}

fn attributes(c: RawCmd) -> Cmd {
    if c.unsubscribe {
        return Cmd::Unsubscribe(c.cmd_id);
    }
    let (entity_type, entity_id) = match entity(&c) {
        Ok(e) => e,
        Err(e) => return e,
    };
    Cmd::Attributes(AttrSub { cmd_id: c.cmd_id, entity_type, entity_id, keys: keys(c.keys.as_deref()), scope: c.scope })
}

fn history(c: RawCmd) -> Cmd {
    let (entity_type, entity_id) = match entity(&c) {
        Ok(e) => e,
        Err(e) => return e,
    };
    if c.agg.as_deref().is_some_and(|a| a != "NONE") {
        return Cmd::Unsupported(c.cmd_id, "agg: only NONE (raw points) over WebSocket; use the REST API".into());
    }
    let (Some(keys), Some(start_ts), Some(end_ts)) = (keys(c.keys.as_deref()), c.start_ts, c.end_ts) else {
        return Cmd::Unsupported(c.cmd_id, "keys, startTs and endTs are required".into());
    };
    Cmd::History(HistoryCmd { cmd_id: c.cmd_id, entity_type, entity_id, keys, start_ts, end_ts, limit: limit(c.limit) })
}

/// Reads a client message at `now` (ms; a `timeWindow` counts back from it).
pub fn parse(text: &str, now: i64) -> Result<Message, String> {
    let raw: RawMessage = serde_json::from_str(text).map_err(|e| format!("invalid command message: {e}"))?;
    let mut cmds = Vec::new();
    for c in raw.cmds {
        cmds.push(match c.cmd_type.as_deref() {
            Some("TIMESERIES") => subscription(c, now),
            Some("TIMESERIES_HISTORY") => history(c),
            Some("ATTRIBUTES") => attributes(c),
            other => Cmd::Unsupported(
                c.cmd_id,
                format!(
                    "command type {:?} is not served: TIMESERIES, TIMESERIES_HISTORY and ATTRIBUTES are",
                    other.unwrap_or("")
                ),
            ),
        });
    }
    cmds.extend(raw.ts_sub_cmds.into_iter().map(|c| subscription(c, now)));
    cmds.extend(raw.history_cmds.into_iter().map(history));
    cmds.extend(raw.attr_sub_cmds.into_iter().map(attributes));
    Ok(Message { auth: raw.auth_cmd.map(|a| (a.cmd_id.unwrap_or(0), a.token)), cmds })
}

/// An update of subscription `cmd_id`: each key's points `(ts, value as text)`, and each
/// key's newest ts.
pub fn update<'a>(cmd_id: i64, series: impl IntoIterator<Item = (&'a str, Vec<(i64, String)>)>) -> J {
    let (mut data, mut latest) = (Map::new(), Map::new());
    for (key, points) in series {
        if let Some(newest) = points.iter().map(|p| p.0).max() {
            latest.insert(key.to_owned(), newest.into());
        }
        data.insert(key.to_owned(), J::Array(points.into_iter().map(|(ts, v)| json!([ts, v])).collect()));
    }
    json!({"subscriptionId": cmd_id, "errorCode": code::NO_ERROR, "errorMsg": null, "data": data,
        "latestValues": latest})
}

/// An error answer to command `cmd_id`.
pub fn error(cmd_id: i64, code: u8, msg: &str) -> J {
    json!({"subscriptionId": cmd_id, "errorCode": code, "errorMsg": msg, "data": {}, "latestValues": {}})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_forms_of_commands_are_read() {
        let m = parse(
            r#"{"authCmd":{"cmdId":0,"token":"T"},"cmds":[
                {"cmdId":1,"type":"TIMESERIES","entityType":"DEVICE","entityId":"D","keys":"a, b","timeWindow":1000},
                {"cmdId":2,"type":"TIMESERIES_HISTORY","entityType":"DEVICE","entityId":"D","keys":"a","startTs":1,"endTs":9,"limit":5},
                {"cmdId":3,"type":"ENTITY_DATA"},
                {"cmdId":1,"type":"TIMESERIES","unsubscribe":true}]}"#,
            5000,
        )
        .unwrap();
        assert_eq!(m.auth, Some((0, "T".into())));
        let sub = TsSub {
            cmd_id: 1,
            entity_type: "DEVICE".into(),
            entity_id: "D".into(),
            keys: Some(vec!["a".into(), "b".into()]),
            history: Some((4000, DEFAULT_LIMIT)),
        };
        assert_eq!(m.cmds[0], Cmd::Subscribe(sub));
        assert!(matches!(&m.cmds[1], Cmd::History(h) if h.keys == ["a"] && h.limit == 5 && h.end_ts == 9));
        assert!(matches!(&m.cmds[2], Cmd::Unsupported(3, _)));
        assert_eq!(m.cmds[3], Cmd::Unsubscribe(1));
        let old =
            parse(r#"{"tsSubCmds":[{"cmdId":7,"entityType":"DEVICE","entityId":"D","scope":"LATEST_TELEMETRY"}]}"#, 0)
                .unwrap();
        assert!(matches!(&old.cmds[0], Cmd::Subscribe(s) if s.cmd_id == 7 && s.keys.is_none() && s.history.is_none()));
        assert!(parse("{", 0).is_err());
        assert!(parse("[]", 0).is_err());
        let attrs =
            parse(r#"{"attrSubCmds":[{"cmdId":9,"entityType":"DEVICE","entityId":"D","scope":"SHARED_SCOPE"}]}"#, 0)
                .unwrap();
        assert!(matches!(&attrs.cmds[0], Cmd::Attributes(a) if a.scope.as_deref() == Some("SHARED_SCOPE")));
        let bad = parse(r#"{"tsSubCmds":[{"cmdId":8}]}"#, 0).unwrap();
        assert!(matches!(&bad.cmds[0], Cmd::Unsupported(8, _)));
    }

    #[test]
    fn updates_have_thingsboards_shape() {
        let u = update(4, [("t", vec![(1, "21.5".to_owned()), (3, "22".to_owned())])]);
        assert_eq!(
            u,
            json!({"subscriptionId": 4, "errorCode": 0, "errorMsg": null, "data": {"t": [[1, "21.5"], [3, "22"]]},
                "latestValues": {"t": 3}})
        );
        assert_eq!(error(5, code::UNAUTHORIZED, "no")["errorCode"], 3);
    }
}
