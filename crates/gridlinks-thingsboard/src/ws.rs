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
//!
//! `ENTITY_DATA` (and the older `entityDataCmds`) is the command ThingsBoard's UI widgets
//! use: a query (an entity filter, a page, entity fields and latest values) answered with
//! a page of entities (`{"cmdId", "data": {"data": [entity…], "totalPages", …}, "update":
//! null, "errorCode", "errorMsg", "cmdUpdateType": "ENTITY_DATA"}`), then, for a `latestCmd`
//! or `tsCmd`, updates of the page's entities in `"update": [entity…]` ([`entity_page`],
//! [`entity_update`], [`entity_data`]). Its query may hold key filters
//! ([`crate::keyfilter`]). `ENTITY_COUNT` (and `entityCountCmds`) counts what such a query
//! selects: `{"cmdId", "count", "errorCode", "errorMsg", "cmdUpdateType": "COUNT_DATA"}`.

use serde::Deserialize;
use serde_json::{json, Map, Value as J};

use crate::keyfilter::{self, KeyFilter};

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
    /// An entity data query and its subscriptions (`ENTITY_DATA`).
    EntityData(Box<EntityDataCmd>),
    /// Ends entity data subscription `cmdId` (`ENTITY_DATA_UNSUBSCRIBE`).
    EntityUnsubscribe(i64),
    /// An `ENTITY_DATA` command this server cannot serve (answered with [`entity_error`]).
    BadEntityData(i64, String),
    /// How many entities a query selects (`ENTITY_COUNT`), then the count whenever it
    /// changes; or why the query cannot be served (answered with [`count_error`]).
    EntityCount(i64, Result<Box<EntityQuery>, String>),
    /// Ends entity count subscription `cmdId` (`ENTITY_COUNT_UNSUBSCRIBE`).
    EntityCountUnsubscribe(i64),
    /// A page of alarms of the entities a query selects (`ALARM_DATA`), then the page
    /// again whenever it changes; or why the query cannot be served.
    AlarmData(i64, Result<Box<AlarmQuery>, String>),
    /// Ends alarm data subscription `cmdId` (`ALARM_DATA_UNSUBSCRIBE`).
    AlarmDataUnsubscribe(i64),
    /// How many alarms a query selects (`ALARM_COUNT`), then the count whenever it changes.
    AlarmCount(i64, Result<Box<AlarmQuery>, String>),
    /// Ends alarm count subscription `cmdId` (`ALARM_COUNT_UNSUBSCRIBE`).
    AlarmCountUnsubscribe(i64),
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

/// What kind of value an entity key names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyType {
    /// A field of the entity itself: `name`, `type`, `label`, `createdTime`, …
    EntityField,
    /// A time series' latest value.
    TimeSeries,
    /// An attribute of any scope.
    Attribute,
    /// A client-side attribute.
    ClientAttribute,
    /// A shared attribute.
    SharedAttribute,
    /// A server-side attribute.
    ServerAttribute,
}

impl KeyType {
    /// ThingsBoard's name of it (`EntityKeyType`).
    pub fn name(self) -> &'static str {
        match self {
            KeyType::EntityField => "ENTITY_FIELD",
            KeyType::TimeSeries => "TIME_SERIES",
            KeyType::Attribute => "ATTRIBUTE",
            KeyType::ClientAttribute => "CLIENT_ATTRIBUTE",
            KeyType::SharedAttribute => "SHARED_ATTRIBUTE",
            KeyType::ServerAttribute => "SERVER_ATTRIBUTE",
        }
    }

    /// The key type ThingsBoard names `s`.
    pub(crate) fn parse(s: &str) -> Result<Self, String> {
        Ok(match s {
            "ENTITY_FIELD" => KeyType::EntityField,
            "TIME_SERIES" => KeyType::TimeSeries,
            "ATTRIBUTE" => KeyType::Attribute,
            "CLIENT_ATTRIBUTE" => KeyType::ClientAttribute,
            "SHARED_ATTRIBUTE" => KeyType::SharedAttribute,
            "SERVER_ATTRIBUTE" => KeyType::ServerAttribute,
            other => return Err(format!("key type {other:?} is not served")),
        })
    }
}

/// An entity key: `{"type", "key"}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EntityKey {
    /// What it names.
    pub key_type: KeyType,
    /// Its name.
    pub key: String,
}

/// The entity types a query may select.
pub const ENTITY_TYPES: [&str; 3] = ["DEVICE", "ASSET", "CUSTOMER"];

/// Which entities a query selects (devices, assets or customers the caller may see).
#[derive(Debug, Clone, PartialEq)]
pub enum EntityFilter {
    /// `singleEntity`: one entity.
    Single {
        /// Its type.
        entity_type: String,
        /// Its id.
        id: String,
    },
    /// `entityList`: these entities of one type.
    List {
        /// Their type.
        entity_type: String,
        /// Their ids.
        ids: Vec<String>,
    },
    /// `entityType` (every entity of the type) or `entityName` (those whose name matches
    /// [`name_matches`]).
    OfType {
        /// The type.
        entity_type: String,
        /// `entityNameFilter`.
        name_filter: Option<String>,
    },
    /// `deviceType` / `assetType`: devices or assets of these types (profile names) whose
    /// name matches [`name_matches`].
    Subtype {
        /// `DEVICE` or `ASSET`.
        entity_type: &'static str,
        /// The types (`deviceTypes`, or the older single `deviceType`; the same for assets).
        types: Vec<String>,
        /// `deviceNameFilter` / `assetNameFilter`.
        name_filter: Option<String>,
    },
    /// `relationsQuery`, `assetSearchQuery`, `deviceSearchQuery`: the entities related to a
    /// root.
    Relations(RelationFilter),
}

/// An entity filter that follows relations from a root entity.
#[derive(Debug, Clone, PartialEq)]
pub struct RelationFilter {
    /// The root: its entity type and id.
    pub root: (String, String),
    /// `FROM` (relations that start at the root) or `TO`.
    pub direction: String,
    /// Most steps (`maxLevel`; 0: no bound).
    pub max_level: usize,
    /// `fetchLastLevelOnly`.
    pub last_level_only: bool,
    /// `(relation type, entity types)`: a relation is followed when it passes one (none:
    /// every relation).
    pub filters: Vec<(Option<String>, Vec<String>)>,
    /// The search queries: only entities of this type with one of these subtypes (none:
    /// any subtype).
    pub subtypes: Option<(&'static str, Vec<String>)>,
}

/// Whether `name` matches ThingsBoard's entity name filter, in any case: a SQL `LIKE`
/// pattern (`%` for any text) when it starts or ends with `%`, else a prefix.
pub fn name_matches(name: &str, pattern: &str) -> bool {
    let (name, pattern) = (name.to_lowercase(), pattern.to_lowercase());
    if !pattern.starts_with('%') && !pattern.ends_with('%') {
        return name.starts_with(&pattern);
    }
    let parts: Vec<&str> = pattern.split('%').collect();
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if name.len() < first.len() + last.len() || !name.starts_with(first) || !name.ends_with(last) {
        return false;
    }
    let mut rest = &name[first.len()..name.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    true
}

/// An `ENTITY_DATA` query.
#[derive(Debug, Clone, PartialEq)]
pub struct EntityQuery {
    /// The entities.
    pub filter: EntityFilter,
    /// `pageLink.pageSize` (at most [`MAX_PAGE`]).
    pub page_size: usize,
    /// `pageLink.page`.
    pub page: usize,
    /// `pageLink.textSearch`: name contains (any case).
    pub text_search: Option<String>,
    /// `pageLink.sortOrder`: the key, and whether descending.
    pub sort: Option<(EntityKey, bool)>,
    /// `keyFilters`: all must hold.
    pub key_filters: Vec<KeyFilter>,
    /// `entityFields`.
    pub entity_fields: Vec<EntityKey>,
    /// `latestValues`.
    pub latest_values: Vec<EntityKey>,
}

/// The query of an `ALARM_DATA` or `ALARM_COUNT` command (ThingsBoard's `AlarmDataQuery`,
/// `AlarmCountQuery`).
#[derive(Debug, Clone, PartialEq)]
pub struct AlarmQuery {
    /// The entities whose alarms are wanted; `None` (`ALARM_COUNT` only): every alarm the
    /// caller may see.
    pub filter: Option<EntityFilter>,
    /// `keyFilters` on the entities.
    pub key_filters: Vec<KeyFilter>,
    /// `pageLink.pageSize` (at most [`MAX_PAGE`]).
    pub page_size: usize,
    /// `pageLink.page`.
    pub page: usize,
    /// `pageLink.textSearch`.
    pub text_search: Option<String>,
    /// `pageLink.sortOrder`: an `ALARM_FIELD` key, and whether descending.
    pub sort: Option<(String, bool)>,
    /// `statusList` (`ANY`, `ACTIVE`, `CLEARED`, `ACK`, `UNACK`).
    pub statuses: Vec<String>,
    /// `severityList`.
    pub severities: Vec<String>,
    /// `typeList`.
    pub types: Vec<String>,
    /// `startTs`, `endTs`, `timeWindow` (ms; 0: none).
    pub start_ts: i64,
    /// See `start_ts`.
    pub end_ts: i64,
    /// See `start_ts`.
    pub time_window: i64,
    /// `assigneeId`.
    pub assignee: Option<String>,
    /// `entityFields` shown with each alarm.
    pub entity_fields: Vec<EntityKey>,
    /// `latestValues` shown with each alarm.
    pub latest_values: Vec<EntityKey>,
}

impl AlarmQuery {
    /// The `createdTime` window at `now`: `timeWindow` counts back from now (or forward
    /// from `startTs`); else `startTs`/`endTs` where given.
    pub fn window(&self, now: i64) -> (Option<i64>, Option<i64>) {
        if self.time_window > 0 {
            return match self.start_ts > 0 {
                true => (Some(self.start_ts), Some(self.start_ts + self.time_window)),
                false => (Some(now - self.time_window), Some(now)),
            };
        }
        ((self.start_ts > 0).then_some(self.start_ts), (self.end_ts > 0).then_some(self.end_ts))
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawAlarmQuery {
    entity_filter: Option<RawFilter>,
    key_filters: Option<J>,
    page_link: Option<RawAlarmPageLink>,
    #[serde(default)]
    entity_fields: Vec<RawKey>,
    #[serde(default)]
    latest_values: Vec<RawKey>,
    // `ALARM_COUNT` has these at the top level.
    #[serde(flatten)]
    link: RawAlarmPageLink,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct RawAlarmPageLink {
    page_size: Option<i64>,
    page: Option<i64>,
    text_search: Option<String>,
    sort_order: Option<RawSort>,
    status_list: Option<Vec<String>>,
    severity_list: Option<Vec<String>>,
    type_list: Option<Vec<String>>,
    start_ts: Option<i64>,
    end_ts: Option<i64>,
    time_window: Option<i64>,
    assignee_id: Option<J>,
}

/// An alarm query as `ALARM_DATA` (`count` false: `pageLink` holds the filters) or
/// `ALARM_COUNT` (they are at the top level) sends it, and as `POST /api/alarmsQuery/find`
/// and `…/count` receive it.
pub fn parse_alarm_query(q: J, count: bool) -> Result<AlarmQuery, String> {
    let raw: RawAlarmQuery = serde_json::from_value(q).map_err(|e| format!("invalid alarm query: {e}"))?;
    let link = match raw.page_link {
        Some(l) if !count => l,
        _ => raw.link,
    };
    let filter = match raw.entity_filter {
        Some(f) => Some(filter(f)?),
        None if count => None,
        None => return Err("ALARM_DATA without an entityFilter".into()),
    };
    let page_size = link.page_size.unwrap_or(10);
    if !(1..=MAX_PAGE as i64).contains(&page_size) {
        return Err(format!("pageSize must be between 1 and {MAX_PAGE}"));
    }
    let sort = match link.sort_order {
        Some(s) if s.key.key_type == "ALARM_FIELD" => {
            Some((s.key.key, s.direction.is_some_and(|d| d.eq_ignore_ascii_case("DESC"))))
        }
        Some(s) => return Err(format!("alarms sort by an ALARM_FIELD key, not {}", s.key.key_type)),
        None => None,
    };
    let assignee = match link.assignee_id {
        Some(J::String(s)) => Some(s),
        Some(J::Object(o)) => o.get("id").and_then(J::as_str).map(str::to_owned),
        _ => None,
    };
    Ok(AlarmQuery {
        filter,
        key_filters: keyfilter::parse(raw.key_filters)?,
        page_size: page_size as usize,
        page: usize::try_from(link.page.unwrap_or(0)).map_err(|_| "page must not be negative")?,
        text_search: link.text_search.filter(|t| !t.is_empty()),
        sort,
        statuses: link.status_list.unwrap_or_default(),
        severities: link.severity_list.unwrap_or_default(),
        types: link.type_list.unwrap_or_default(),
        start_ts: link.start_ts.unwrap_or(0),
        end_ts: link.end_ts.unwrap_or(0),
        time_window: link.time_window.unwrap_or(0),
        assignee,
        entity_fields: entity_keys(raw.entity_fields)?,
        latest_values: entity_keys(raw.latest_values)?,
    })
}

fn alarm_query(q: Option<J>, count: bool) -> Result<Box<AlarmQuery>, String> {
    parse_alarm_query(q.ok_or("an alarm command without a query")?, count).map(Box::new)
}

fn alarm_data_cmd(c: RawCmd) -> Cmd {
    Cmd::AlarmData(c.cmd_id, alarm_query(c.query, false))
}

fn alarm_count_cmd(c: RawCmd) -> Cmd {
    Cmd::AlarmCount(c.cmd_id, alarm_query(c.query, true))
}

/// A `tsCmd` or `historyCmd` of an `ENTITY_DATA` command.
#[derive(Debug, Clone, PartialEq)]
pub struct EntitySeriesCmd {
    /// Keys.
    pub keys: Vec<String>,
    /// Window start, ms.
    pub start_ts: i64,
    /// Window end, ms (a `tsCmd`: now).
    pub end_ts: i64,
    /// Most points per key.
    pub limit: usize,
}

/// An `ENTITY_DATA` command: a query, and what to follow of its entities.
#[derive(Debug, Clone, PartialEq)]
pub struct EntityDataCmd {
    /// The client's id for it.
    pub cmd_id: i64,
    /// The query; `None`: the one this `cmdId` sent before.
    pub query: Option<EntityQuery>,
    /// `latestCmd.keys`: follow these latest values.
    pub latest: Option<Vec<EntityKey>>,
    /// `tsCmd`: the window's points, then every new point.
    pub ts: Option<EntitySeriesCmd>,
    /// `historyCmd`: the window's points, once.
    pub history: Option<EntitySeriesCmd>,
}

/// Largest page an `ENTITY_DATA` query may ask for.
pub const MAX_PAGE: usize = 1000;

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
    #[serde(default)]
    entity_data_cmds: Vec<RawCmd>,
    #[serde(default)]
    entity_data_unsubscribe_cmds: Vec<RawCmd>,
    #[serde(default)]
    entity_count_cmds: Vec<RawCmd>,
    #[serde(default)]
    entity_count_unsubscribe_cmds: Vec<RawCmd>,
    #[serde(default)]
    alarm_data_cmds: Vec<RawCmd>,
    #[serde(default)]
    alarm_data_unsubscribe_cmds: Vec<RawCmd>,
    #[serde(default)]
    alarm_count_cmds: Vec<RawCmd>,
    #[serde(default)]
    alarm_count_unsubscribe_cmds: Vec<RawCmd>,
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
    /// An entity query, or an alarm query (read by the command's type).
    query: Option<J>,
    latest_cmd: Option<RawLatest>,
    ts_cmd: Option<RawSeries>,
    history_cmd: Option<RawSeries>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawQuery {
    entity_filter: RawFilter,
    page_link: Option<RawPageLink>,
    #[serde(default)]
    entity_fields: Vec<RawKey>,
    #[serde(default)]
    latest_values: Vec<RawKey>,
    key_filters: Option<J>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawFilter {
    #[serde(rename = "type")]
    filter_type: String,
    single_entity: Option<RawEntityId>,
    entity_type: Option<String>,
    entity_list: Option<Vec<String>>,
    device_type: Option<String>,
    device_types: Option<Vec<String>>,
    device_name_filter: Option<String>,
    entity_name_filter: Option<String>,
    asset_type: Option<String>,
    asset_types: Option<Vec<String>>,
    asset_name_filter: Option<String>,
    root_entity: Option<RawEntityId>,
    direction: Option<String>,
    #[serde(default)]
    filters: Vec<RawRelationFilter>,
    max_level: Option<u64>,
    #[serde(default)]
    fetch_last_level_only: bool,
    relation_type: Option<String>,
    #[serde(default)]
    multi_root: bool,
    #[serde(default)]
    negate: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawRelationFilter {
    relation_type: Option<String>,
    #[serde(default)]
    entity_types: Vec<String>,
    #[serde(default)]
    negate: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawEntityId {
    entity_type: String,
    id: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawPageLink {
    page_size: Option<i64>,
    page: Option<i64>,
    text_search: Option<String>,
    sort_order: Option<RawSort>,
}

#[derive(Deserialize)]
struct RawSort {
    key: RawKey,
    direction: Option<String>,
}

#[derive(Deserialize)]
struct RawKey {
    #[serde(rename = "type")]
    key_type: String,
    key: String,
}

#[derive(Deserialize)]
struct RawLatest {
    #[serde(default)]
    keys: Vec<RawKey>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawSeries {
    #[serde(default)]
    keys: Vec<String>,
    start_ts: Option<i64>,
    end_ts: Option<i64>,
    time_window: Option<i64>,
    limit: Option<i64>,
    agg: Option<String>,
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

fn entity_key(k: RawKey) -> Result<EntityKey, String> {
    Ok(EntityKey { key_type: KeyType::parse(&k.key_type)?, key: k.key })
}

fn entity_keys(keys: Vec<RawKey>) -> Result<Vec<EntityKey>, String> {
    keys.into_iter().map(entity_key).collect()
}

fn served(t: &str) -> Result<String, String> {
    match ENTITY_TYPES.contains(&t) {
        true => Ok(t.to_owned()),
        false => Err(format!("entity type {t:?} is not served: {} are", ENTITY_TYPES.join(", "))),
    }
}

fn filter(f: RawFilter) -> Result<EntityFilter, String> {
    let subtypes = |many: Option<Vec<String>>, one: Option<String>| -> Vec<String> {
        many.unwrap_or_default().into_iter().chain(one).filter(|t| !t.is_empty()).collect()
    };
    let root = |f: &RawFilter| -> Result<(String, String), String> {
        let r = f.root_entity.as_ref().ok_or("a relations filter without rootEntity")?;
        Ok((r.entity_type.clone(), r.id.clone()))
    };
    let relations = |f: &RawFilter, filters, subtypes| -> Result<EntityFilter, String> {
        if f.multi_root || f.negate {
            return Err("multi-root and negated relation queries are not served".into());
        }
        Ok(EntityFilter::Relations(RelationFilter {
            root: root(f)?,
            direction: match f.direction.as_deref().unwrap_or("FROM") {
                d @ ("FROM" | "TO") => d.to_owned(),
                other => return Err(format!("direction {other:?}: FROM or TO")),
            },
            max_level: f.max_level.unwrap_or(1) as usize,
            last_level_only: f.fetch_last_level_only,
            filters,
            subtypes,
        }))
    };
    Ok(match f.filter_type.as_str() {
        "singleEntity" => {
            let e = f.single_entity.ok_or("singleEntity filter without singleEntity")?;
            EntityFilter::Single { entity_type: served(&e.entity_type)?, id: e.id }
        }
        "entityList" => EntityFilter::List {
            entity_type: served(f.entity_type.as_deref().unwrap_or(""))?,
            ids: f.entity_list.unwrap_or_default(),
        },
        "entityType" => {
            EntityFilter::OfType { entity_type: served(f.entity_type.as_deref().unwrap_or(""))?, name_filter: None }
        }
        "entityName" => EntityFilter::OfType {
            entity_type: served(f.entity_type.as_deref().unwrap_or(""))?,
            name_filter: Some(f.entity_name_filter.unwrap_or_default()),
        },
        "deviceType" => EntityFilter::Subtype {
            entity_type: "DEVICE",
            types: subtypes(f.device_types, f.device_type),
            name_filter: f.device_name_filter.filter(|n| !n.is_empty()),
        },
        "assetType" => EntityFilter::Subtype {
            entity_type: "ASSET",
            types: subtypes(f.asset_types, f.asset_type),
            name_filter: f.asset_name_filter.filter(|n| !n.is_empty()),
        },
        "relationsQuery" => {
            let mut filters = Vec::with_capacity(f.filters.len());
            for r in &f.filters {
                if r.negate {
                    return Err("negated relation filters are not served".into());
                }
                filters.push((r.relation_type.clone().filter(|t| !t.is_empty()), r.entity_types.clone()));
            }
            relations(&f, filters, None)?
        }
        "assetSearchQuery" | "deviceSearchQuery" => {
            let (t, types) = match f.filter_type.as_str() {
                "assetSearchQuery" => ("ASSET", f.asset_types.clone().unwrap_or_default()),
                _ => ("DEVICE", f.device_types.clone().unwrap_or_default()),
            };
            let filters = vec![(f.relation_type.clone().filter(|t| !t.is_empty()), vec![t.to_owned()])];
            relations(&f, filters, Some((t, types)))?
        }
        other => {
            return Err(format!(
                "entity filter {other:?} is not served: singleEntity, entityList, entityType, entityName, deviceType, assetType, relationsQuery, assetSearchQuery and deviceSearchQuery are"
            ))
        }
    })
}

/// An entity data query as `POST /api/entitiesQuery/find` (and `…/count`) receives it.
pub fn parse_query(q: J) -> Result<EntityQuery, String> {
    query(serde_json::from_value(q).map_err(|e| format!("Invalid request body: {e}"))?)
}

fn query(q: RawQuery) -> Result<EntityQuery, String> {
    let link = q.page_link.unwrap_or(RawPageLink { page_size: None, page: None, text_search: None, sort_order: None });
    let page_size = link.page_size.unwrap_or(10);
    if !(1..=MAX_PAGE as i64).contains(&page_size) {
        return Err(format!("pageSize must be between 1 and {MAX_PAGE}"));
    }
    let sort = match link.sort_order {
        Some(s) => Some((entity_key(s.key)?, s.direction.is_some_and(|d| d.eq_ignore_ascii_case("DESC")))),
        None => None,
    };
    Ok(EntityQuery {
        filter: filter(q.entity_filter)?,
        page_size: page_size as usize,
        page: usize::try_from(link.page.unwrap_or(0)).map_err(|_| "page must not be negative")?,
        text_search: link.text_search.filter(|t| !t.is_empty()),
        sort,
        entity_fields: entity_keys(q.entity_fields)?,
        latest_values: entity_keys(q.latest_values)?,
        key_filters: keyfilter::parse(q.key_filters)?,
    })
}

/// An entity query of a command.
fn raw_query(q: J) -> Result<EntityQuery, String> {
    query(serde_json::from_value(q).map_err(|e| format!("invalid query: {e}"))?)
}

fn entity_count_cmd(c: RawCmd) -> Cmd {
    let q = c.query.ok_or_else(|| "ENTITY_COUNT without a query".to_owned()).and_then(raw_query);
    Cmd::EntityCount(c.cmd_id, q.map(Box::new))
}

fn series(s: RawSeries, now: i64, live: bool) -> Result<EntitySeriesCmd, String> {
    if s.agg.as_deref().is_some_and(|a| a != "NONE") {
        return Err("agg: only NONE (raw points) over WebSocket; use the REST API".into());
    }
    let start_ts =
        s.start_ts.or(s.time_window.map(|w| now.saturating_sub(w))).ok_or("startTs or timeWindow is required")?;
    let end_ts = if live { now + 1 } else { s.end_ts.ok_or("endTs is required")? };
    Ok(EntitySeriesCmd { keys: s.keys, start_ts, end_ts, limit: limit(s.limit) })
}

fn entity_data_cmd(c: RawCmd, now: i64) -> Cmd {
    let cmd_id = c.cmd_id;
    let read = || -> Result<EntityDataCmd, String> {
        Ok(EntityDataCmd {
            cmd_id,
            query: c.query.map(raw_query).transpose()?,
            latest: c.latest_cmd.map(|l| entity_keys(l.keys)).transpose()?,
            ts: c.ts_cmd.map(|s| series(s, now, true)).transpose()?,
            history: c.history_cmd.map(|s| series(s, now, false)).transpose()?,
        })
    };
    read().map_or_else(|e| Cmd::BadEntityData(cmd_id, e), |e| Cmd::EntityData(Box::new(e)))
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
            Some("ENTITY_DATA") => entity_data_cmd(c, now),
            Some("ENTITY_DATA_UNSUBSCRIBE") => Cmd::EntityUnsubscribe(c.cmd_id),
            Some("ENTITY_COUNT") => entity_count_cmd(c),
            Some("ENTITY_COUNT_UNSUBSCRIBE") => Cmd::EntityCountUnsubscribe(c.cmd_id),
            Some("ALARM_DATA") => alarm_data_cmd(c),
            Some("ALARM_DATA_UNSUBSCRIBE") => Cmd::AlarmDataUnsubscribe(c.cmd_id),
            Some("ALARM_COUNT") => alarm_count_cmd(c),
            Some("ALARM_COUNT_UNSUBSCRIBE") => Cmd::AlarmCountUnsubscribe(c.cmd_id),
            other => Cmd::Unsupported(
                c.cmd_id,
                format!(
                    "command type {:?} is not served: TIMESERIES, TIMESERIES_HISTORY, ATTRIBUTES, ENTITY_DATA, \
                     ENTITY_DATA_UNSUBSCRIBE, ENTITY_COUNT, ENTITY_COUNT_UNSUBSCRIBE, ALARM_DATA, \
                     ALARM_DATA_UNSUBSCRIBE, ALARM_COUNT and ALARM_COUNT_UNSUBSCRIBE are",
                    other.unwrap_or("")
                ),
            ),
        });
    }
    cmds.extend(raw.entity_data_cmds.into_iter().map(|c| entity_data_cmd(c, now)));
    cmds.extend(raw.entity_data_unsubscribe_cmds.into_iter().map(|c| Cmd::EntityUnsubscribe(c.cmd_id)));
    cmds.extend(raw.entity_count_cmds.into_iter().map(entity_count_cmd));
    cmds.extend(raw.entity_count_unsubscribe_cmds.into_iter().map(|c| Cmd::EntityCountUnsubscribe(c.cmd_id)));
    cmds.extend(raw.alarm_data_cmds.into_iter().map(alarm_data_cmd));
    cmds.extend(raw.alarm_data_unsubscribe_cmds.into_iter().map(|c| Cmd::AlarmDataUnsubscribe(c.cmd_id)));
    cmds.extend(raw.alarm_count_cmds.into_iter().map(alarm_count_cmd));
    cmds.extend(raw.alarm_count_unsubscribe_cmds.into_iter().map(|c| Cmd::AlarmCountUnsubscribe(c.cmd_id)));
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

/// An entity as an `ENTITY_DATA` answer shows it: its id, its latest values by key type
/// (`{"TIME_SERIES": {"key": {"ts", "value"}}}`) and its time series (`{"key": [{"ts",
/// "value"}]}`).
pub fn entity_data<'a>(
    entity_type: &str,
    entity_id: &str,
    latest: impl IntoIterator<Item = (KeyType, String, i64, String)>,
    timeseries: impl IntoIterator<Item = (&'a str, Vec<(i64, String)>)>,
) -> J {
    let mut by_type = Map::new();
    for (t, key, ts, value) in latest {
        let section = by_type.entry(t.name()).or_insert_with(|| J::Object(Map::new()));
        if let J::Object(m) = section {
            m.insert(key, json!({"ts": ts, "value": value}));
        }
    }
    let series: Map<String, J> = timeseries
        .into_iter()
        .map(|(k, points)| (k.to_owned(), points.into_iter().map(|(ts, v)| json!({"ts": ts, "value": v})).collect()))
        .collect();
    json!({"entityId": {"entityType": entity_type, "id": entity_id}, "latest": by_type, "timeseries": series})
}

/// The first answer to an `ENTITY_DATA` query: a page of entities ([`entity_data`]).
pub fn entity_page(cmd_id: i64, data: Vec<J>, total: usize, page_size: usize, page: usize) -> J {
    let total_pages = total.div_ceil(page_size.max(1));
    let page = json!({"data": data, "totalPages": total_pages, "totalElements": total,
        "hasNext": (page + 1) < total_pages});
    json!({"cmdId": cmd_id, "data": page, "update": null, "errorCode": code::NO_ERROR, "errorMsg": null,
        "cmdUpdateType": "ENTITY_DATA"})
}

/// A later answer to an `ENTITY_DATA` command: what changed of some of its entities.
pub fn entity_update(cmd_id: i64, update: Vec<J>) -> J {
    json!({"cmdId": cmd_id, "data": null, "update": update, "errorCode": code::NO_ERROR, "errorMsg": null,
        "cmdUpdateType": "ENTITY_DATA"})
}

/// An error answer to `ENTITY_DATA` command `cmd_id`.
pub fn entity_error(cmd_id: i64, code: u8, msg: &str) -> J {
    json!({"cmdId": cmd_id, "data": null, "update": null, "errorCode": code, "errorMsg": msg,
        "cmdUpdateType": "ENTITY_DATA"})
}

/// An answer to `ENTITY_COUNT` command `cmd_id`: how many entities its query selects.
pub fn count_update(cmd_id: i64, count: usize) -> J {
    json!({"cmdId": cmd_id, "count": count, "errorCode": code::NO_ERROR, "errorMsg": null,
        "cmdUpdateType": "COUNT_DATA"})
}

/// An answer to `ALARM_DATA` command `cmd_id`: a page of alarms (`AlarmData`: an alarm's
/// info with `entityId` and `latest`), and how many entities the query selected (of at
/// most `allowed`).
pub fn alarm_page(
    cmd_id: i64,
    data: Vec<J>,
    total: usize,
    page_size: usize,
    page: usize,
    entities: (usize, usize),
) -> J {
    let total_pages = total.div_ceil(page_size.max(1));
    let page = json!({"data": data, "totalPages": total_pages, "totalElements": total,
        "hasNext": (page + 1) < total_pages});
    json!({"cmdId": cmd_id, "data": page, "update": null, "errorCode": code::NO_ERROR, "errorMsg": null,
        "cmdUpdateType": "ALARM_DATA", "allowedEntities": entities.1, "totalEntities": entities.0})
}

/// An error answer to `ALARM_DATA` command `cmd_id`.
pub fn alarm_error(cmd_id: i64, code: u8, msg: &str) -> J {
    json!({"cmdId": cmd_id, "data": null, "update": null, "errorCode": code, "errorMsg": msg,
        "cmdUpdateType": "ALARM_DATA"})
}

/// An answer to `ALARM_COUNT` command `cmd_id`.
pub fn alarm_count(cmd_id: i64, count: usize) -> J {
    json!({"cmdId": cmd_id, "count": count, "errorCode": code::NO_ERROR, "errorMsg": null,
        "cmdUpdateType": "ALARM_COUNT_DATA"})
}

/// An error answer to `ALARM_COUNT` command `cmd_id`.
pub fn alarm_count_error(cmd_id: i64, code: u8, msg: &str) -> J {
    json!({"cmdId": cmd_id, "count": 0, "errorCode": code, "errorMsg": msg, "cmdUpdateType": "ALARM_COUNT_DATA"})
}

/// An error answer to `ENTITY_COUNT` command `cmd_id`.
pub fn count_error(cmd_id: i64, code: u8, msg: &str) -> J {
    json!({"cmdId": cmd_id, "count": 0, "errorCode": code, "errorMsg": msg, "cmdUpdateType": "COUNT_DATA"})
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
                {"cmdId":3,"type":"ALARM_STATUS"},
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
    fn count_commands_and_key_filters_are_read() {
        let m = parse(
            r#"{"cmds":[{"cmdId":1,"type":"ENTITY_COUNT","query":{"entityFilter":{"type":"entityType","entityType":"DEVICE"},
                "keyFilters":[{"key":{"type":"TIME_SERIES","key":"t"},"valueType":"NUMERIC",
                  "predicate":{"type":"NUMERIC","operation":"GREATER","value":{"defaultValue":20,"dynamicValue":null}}}]}},
              {"cmdId":2,"type":"ENTITY_COUNT"},
              {"cmdId":1,"type":"ENTITY_COUNT_UNSUBSCRIBE"}],
              "entityCountCmds":[{"cmdId":3,"query":{"entityFilter":{"type":"entityType","entityType":"DEVICE"}}}]}"#,
            0,
        )
        .unwrap();
        let Cmd::EntityCount(1, Ok(q)) = &m.cmds[0] else { panic!("{:?}", m.cmds[0]) };
        assert_eq!(q.key_filters[0].key, EntityKey { key_type: KeyType::TimeSeries, key: "t".into() });
        assert!(q.key_filters[0].predicate.matches(Some(&gridlinks_types::Value::Long(21))));
        assert!(matches!(&m.cmds[1], Cmd::EntityCount(2, Err(why)) if why.contains("without a query")));
        assert_eq!(m.cmds[2], Cmd::EntityCountUnsubscribe(1));
        assert!(matches!(&m.cmds[3], Cmd::EntityCount(3, Ok(q)) if q.key_filters.is_empty()));
        assert_eq!(
            count_update(1, 7),
            json!({"cmdId": 1, "count": 7, "errorCode": 0, "errorMsg": null, "cmdUpdateType": "COUNT_DATA"})
        );
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

    #[test]
    fn entity_data_commands_are_read() {
        let m = parse(
            r#"{"cmds":[{"cmdId":4,"type":"ENTITY_DATA","query":{
                "entityFilter":{"type":"deviceType","deviceTypes":["thermostat"],"deviceNameFilter":"Th"},
                "pageLink":{"pageSize":5,"page":1,"textSearch":"","sortOrder":{"key":{"type":"ENTITY_FIELD","key":"name"},"direction":"DESC"}},
                "entityFields":[{"type":"ENTITY_FIELD","key":"name"}],
                "latestValues":[{"type":"TIME_SERIES","key":"t"},{"type":"SHARED_ATTRIBUTE","key":"target"}]},
              "latestCmd":{"keys":[{"type":"TIME_SERIES","key":"t"}]},
              "tsCmd":{"keys":["t"],"timeWindow":1000,"limit":7}},
              {"cmdId":5,"type":"ENTITY_DATA","historyCmd":{"keys":["t"],"startTs":1,"endTs":9}},
              {"cmdId":6,"type":"ENTITY_DATA","query":{"entityFilter":{"type":"singleEntity","singleEntity":{"entityType":"EDGE","id":"A"}}}},
              {"cmdId":7,"type":"ENTITY_DATA","tsCmd":{"keys":["t"],"timeWindow":1,"agg":"AVG"}},
              {"cmdId":4,"type":"ENTITY_DATA_UNSUBSCRIBE"}]}"#,
            5000,
        )
        .unwrap();
        let Cmd::EntityData(e) = &m.cmds[0] else { panic!("{:?}", m.cmds[0]) };
        let q = e.query.as_ref().unwrap();
        assert_eq!(
            q.filter,
            EntityFilter::Subtype {
                entity_type: "DEVICE",
                types: vec!["thermostat".into()],
                name_filter: Some("Th".into())
            }
        );
        assert_eq!((q.page_size, q.page, q.text_search.as_deref()), (5, 1, None));
        assert_eq!(q.sort, Some((EntityKey { key_type: KeyType::EntityField, key: "name".into() }, true)));
        assert_eq!(q.latest_values[1].key_type, KeyType::SharedAttribute);
        assert_eq!(e.latest.as_ref().unwrap()[0].key, "t");
        assert_eq!(e.ts, Some(EntitySeriesCmd { keys: vec!["t".into()], start_ts: 4000, end_ts: 5001, limit: 7 }));
        assert!(matches!(&m.cmds[1], Cmd::EntityData(h) if h.query.is_none()
            && h.history == Some(EntitySeriesCmd { keys: vec!["t".into()], start_ts: 1, end_ts: 9, limit: DEFAULT_LIMIT })));
        assert!(matches!(&m.cmds[2], Cmd::BadEntityData(6, why) if why.contains("EDGE")));
        assert!(matches!(&m.cmds[3], Cmd::BadEntityData(7, why) if why.contains("agg")));
        assert_eq!(m.cmds[4], Cmd::EntityUnsubscribe(4));
        let old = parse(r#"{"entityDataCmds":[{"cmdId":1,"query":{"entityFilter":{"type":"entityType","entityType":"DEVICE"},"pageLink":{"pageSize":100000}}}]}"#, 0).unwrap();
        assert!(matches!(&old.cmds[0], Cmd::BadEntityData(1, why) if why.contains("pageSize")));
    }

    #[test]
    fn entity_filters_of_assets_names_and_relations_are_read() {
        let q =
            |f: J| parse_query(json!({"entityFilter": f, "pageLink": {"pageSize": 10, "page": 0}})).map(|q| q.filter);
        assert_eq!(
            q(json!({"type": "assetType", "assetTypes": ["building"], "assetType": "floor", "assetNameFilter": "B"})),
            Ok(EntityFilter::Subtype {
                entity_type: "ASSET",
                types: vec!["building".into(), "floor".into()],
                name_filter: Some("B".into())
            })
        );
        assert_eq!(
            q(json!({"type": "entityName", "entityType": "CUSTOMER", "entityNameFilter": "%corp"})),
            Ok(EntityFilter::OfType { entity_type: "CUSTOMER".into(), name_filter: Some("%corp".into()) })
        );
        let Ok(EntityFilter::Relations(r)) = q(json!({"type": "relationsQuery",
            "rootEntity": {"entityType": "ASSET", "id": "R"}, "direction": "FROM", "maxLevel": 2,
            "filters": [{"relationType": "Contains", "entityTypes": ["DEVICE"]}]}))
        else {
            panic!("a relations filter")
        };
        assert_eq!((r.root.0.as_str(), r.max_level, r.direction.as_str()), ("ASSET", 2, "FROM"));
        assert_eq!(r.filters, vec![(Some("Contains".into()), vec!["DEVICE".into()])]);
        let Ok(EntityFilter::Relations(s)) = q(json!({"type": "deviceSearchQuery",
            "rootEntity": {"entityType": "ASSET", "id": "R"}, "relationType": "Contains", "deviceTypes": ["meter"]}))
        else {
            panic!("a search filter")
        };
        assert_eq!(s.subtypes, Some(("DEVICE", vec!["meter".into()])));
        assert!(q(json!({"type": "relationsQuery", "rootEntity": {"entityType": "ASSET", "id": "R"}, "negate": true}))
            .is_err());
        assert!(q(json!({"type": "relationsQuery"})).unwrap_err().contains("rootEntity"));
        assert!(q(json!({"type": "apiUsageState"})).unwrap_err().contains("apiUsageState"));
    }

    #[test]
    fn name_filters_are_prefixes_or_like_patterns() {
        assert!(name_matches("Thermostat A", "therm"));
        assert!(!name_matches("A Thermostat", "therm"));
        assert!(name_matches("A Thermostat", "%THERM%"));
        assert!(name_matches("meter-7", "%-7"));
        assert!(name_matches("a-b-c", "a%c%"));
        assert!(!name_matches("ab", "%abc%"));
        assert!(!name_matches("abc", "a%b%b"));
    }

    #[test]
    fn entity_answers_have_thingsboards_shape() {
        let e = entity_data(
            "DEVICE",
            "D",
            [(KeyType::TimeSeries, "t".to_owned(), 5, "21".to_owned())],
            [("t", vec![(5, "21".to_owned())])],
        );
        assert_eq!(
            entity_page(3, vec![e.clone()], 11, 10, 0),
            json!({"cmdId": 3, "data": {"data": [{"entityId": {"entityType": "DEVICE", "id": "D"},
                "latest": {"TIME_SERIES": {"t": {"ts": 5, "value": "21"}}}, "timeseries": {"t": [{"ts": 5, "value": "21"}]}}],
                "totalPages": 2, "totalElements": 11, "hasNext": true},
                "update": null, "errorCode": 0, "errorMsg": null, "cmdUpdateType": "ENTITY_DATA"})
        );
        assert_eq!(entity_update(3, vec![e])["update"][0]["entityId"]["id"], "D");
        assert_eq!(entity_error(3, code::BAD_REQUEST, "x")["errorCode"], 2);
    }

    #[test]
    fn alarm_commands_are_read_in_both_forms() {
        let m = parse(
            r#"{"cmds":[{"cmdId":1,"type":"ALARM_DATA","query":{"entityFilter":{"type":"entityType","entityType":"DEVICE"},
                "pageLink":{"page":0,"pageSize":5,"sortOrder":{"key":{"type":"ALARM_FIELD","key":"createdTime"},"direction":"DESC"},
                "statusList":["ACTIVE"],"severityList":["CRITICAL"],"typeList":[],"timeWindow":86400000,
                "assigneeId":{"entityType":"USER","id":"u"}},
                "alarmFields":[{"type":"ALARM_FIELD","key":"type"}],"latestValues":[{"type":"TIME_SERIES","key":"t"}]}},
              {"cmdId":2,"type":"ALARM_COUNT","query":{"statusList":["ACTIVE","UNACK"],"searchPropagatedAlarms":false}},
              {"cmdId":3,"type":"ALARM_DATA","query":{"pageLink":{"pageSize":5}}},
              {"cmdId":1,"type":"ALARM_DATA_UNSUBSCRIBE"}],
              "alarmCountCmds":[{"cmdId":4,"query":{"entityFilter":null,"typeList":["Leak"]}}],
              "alarmCountUnsubscribeCmds":[{"cmdId":4}]}"#,
            0,
        )
        .unwrap();
        let Cmd::AlarmData(1, Ok(q)) = &m.cmds[0] else { panic!("{:?}", m.cmds[0]) };
        assert_eq!((q.page_size, q.sort.clone()), (5, Some(("createdTime".to_owned(), true))));
        assert_eq!(
            (q.statuses.clone(), q.severities.clone(), q.assignee.as_deref()),
            (vec!["ACTIVE".to_owned()], vec!["CRITICAL".to_owned()], Some("u"))
        );
        assert_eq!(q.window(100_000_000), (Some(100_000_000 - 86_400_000), Some(100_000_000)));
        assert_eq!(q.latest_values.len(), 1);
        let Cmd::AlarmCount(2, Ok(c)) = &m.cmds[1] else { panic!("{:?}", m.cmds[1]) };
        assert!(c.filter.is_none() && c.statuses == ["ACTIVE", "UNACK"]);
        assert!(matches!(&m.cmds[2], Cmd::AlarmData(3, Err(why)) if why.contains("without an entityFilter")));
        assert_eq!(m.cmds[3], Cmd::AlarmDataUnsubscribe(1));
        assert!(matches!(&m.cmds[4], Cmd::AlarmCount(4, Ok(c)) if c.types == ["Leak"]));
        assert_eq!(m.cmds[5], Cmd::AlarmCountUnsubscribe(4));
    }
}
