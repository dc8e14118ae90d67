//! ThingsBoard's relation API: relations of any type between devices, assets, customers,
//! dashboards, the tenant and profiles (`gridlinks_platform::entities::relations`). The
//! "Created" relation from a gateway to a device is that device's gateway: saving it lets
//! the gateway write for the device, deleting it stops that.
//!
//! | call | answer |
//! |---|---|
//! | `POST /api/relation` / `POST /api/v2/relation` `{"from","to","type","typeGroup","additionalInfo"}` | 200 / the relation |
//! | `DELETE /api/relation` / `DELETE /api/v2/relation` `?fromId=&fromType=&relationType=[&relationTypeGroup=]&toId=&toType=` | 200 / the relation it was |
//! | `DELETE /api/relations?entityId=&entityType=` | every relation from and to it goes |
//! | `GET /api/relation?fromId=&fromType=&relationType=&toId=&toType=` | the relation, 404 if none |
//! | `GET /api/relations[/info]?fromId=&fromType=[&relationType=]` (or `toId`, `toType`) | relations (infos: with `fromName`, `toName`) |
//! | `GET /api/relations[/info]/from/{type}/{id}[/{relationType}]`, `…/to/…` | the same, ThingsBoard 4.x paths |
//! | `POST /api/relations[/info]` `{"parameters":{…},"filters":[…]}` | a relations query |

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use gridlinks_platform::auth::Caller;
use gridlinks_platform::entities::relations::{
    self, Direction, EntityKind, EntityRef, Listed, Relation, RelationsQuery, COMMON,
};
use gridlinks_platform::Core;
use serde::Deserialize;
use serde_json::Value as J;

use super::api::parse_json;
use super::error::{ApiError, ApiResult};
use super::extract::{Admin, Body, User, Q};

type St = State<Arc<Core>>;

/// `POST /api/relation`.
pub async fn save(Admin(me): Admin, State(st): St, Body(body): Body) -> ApiResult<StatusCode> {
    relations::save(&st, &me, Relation::parse(&parse_json(&body)?)?).await?;
    Ok(StatusCode::OK)
}

/// `POST /api/v2/relation`: the relation saved.
pub async fn save_v2(Admin(me): Admin, State(st): St, Body(body): Body) -> ApiResult<Json<J>> {
    Ok(Json(relations::save(&st, &me, Relation::parse(&parse_json(&body)?)?).await?.json()))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RelationParams {
    from_id: Option<String>,
    from_type: Option<String>,
    relation_type: Option<String>,
    relation_type_group: Option<String>,
    to_id: Option<String>,
    to_type: Option<String>,
}

/// An end named by `id` and `entity_type` (`DEVICE` when absent, as GridLinks answered
/// before relations had other types).
fn end(id: Option<&String>, entity_type: Option<&String>) -> ApiResult<Option<EntityRef>> {
    id.map(|id| EntityRef::of(entity_type.map_or("DEVICE", String::as_str), id).map_err(ApiError::from)).transpose()
}

/// Both ends, the type and group of a single relation.
fn one(p: &RelationParams) -> ApiResult<(EntityRef, EntityRef, &str, &str)> {
    let (Some(from), Some(to)) =
        (end(p.from_id.as_ref(), p.from_type.as_ref())?, end(p.to_id.as_ref(), p.to_type.as_ref())?)
    else {
        return Err(ApiError::bad_request("fromId, fromType, toId and toType are required"));
    };
    let t = p
        .relation_type
        .as_deref()
        .filter(|t| !t.is_empty())
        .ok_or_else(|| ApiError::bad_request("relationType is required"))?;
    Ok((from, to, t, p.relation_type_group.as_deref().unwrap_or(COMMON)))
}

/// `DELETE /api/relation?…`.
pub async fn delete(Admin(me): Admin, State(st): St, Q(p): Q<RelationParams>) -> ApiResult<StatusCode> {
    let (from, to, t, g) = one(&p)?;
    relations::delete(&st, &me, from, to, t, g).await?;
    Ok(StatusCode::OK)
}

/// `DELETE /api/v2/relation?…`: the relation it was.
pub async fn delete_v2(Admin(me): Admin, State(st): St, Q(p): Q<RelationParams>) -> ApiResult<Json<J>> {
    let (from, to, t, g) = one(&p)?;
    Ok(Json(relations::delete(&st, &me, from, to, t, g).await?.json()))
}

/// `GET /api/relation?…`.
pub async fn get(User(me): User, State(st): St, Q(p): Q<RelationParams>) -> ApiResult<Json<J>> {
    let (from, to, t, g) = one(&p)?;
    Ok(Json(relations::get(&st, &me, from, to, t, g).await?.json()))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EntityParams {
    entity_id: String,
    entity_type: String,
}

/// `DELETE /api/relations?entityId=&entityType=`.
pub async fn delete_all(Admin(me): Admin, State(st): St, Q(p): Q<EntityParams>) -> ApiResult<StatusCode> {
    relations::delete_all(&st, &me, EntityRef::of(&p.entity_type, &p.entity_id)?).await?;
    Ok(StatusCode::OK)
}

fn render(listed: Vec<Listed>, info: bool) -> Json<J> {
    Json(J::Array(
        listed
            .into_iter()
            .map(|l| match info {
                true => l.relation.info_json(&l.from_name, &l.to_name),
                false => l.relation.json(),
            })
            .collect(),
    ))
}

async fn list_params(st: &Core, me: &Caller, p: RelationParams, info: bool) -> ApiResult<Json<J>> {
    let (e, dir) = match (end(p.from_id.as_ref(), p.from_type.as_ref())?, end(p.to_id.as_ref(), p.to_type.as_ref())?) {
        (Some(from), None) => (from, Direction::From),
        (None, Some(to)) => (to, Direction::To),
        _ => return Err(ApiError::bad_request("give either fromId and fromType, or toId and toType")),
    };
    let found = relations::at(st, me, e, dir, p.relation_type, p.relation_type_group).await?;
    Ok(render(found, info))
}

/// `GET /api/relations?fromId=&fromType=…` or `?toId=&toType=…`.
pub async fn list(User(me): User, State(st): St, Q(p): Q<RelationParams>) -> ApiResult<Json<J>> {
    list_params(&st, &me, p, false).await
}

/// `GET /api/relations/info?…`: with the ends' names.
pub async fn list_info(User(me): User, State(st): St, Q(p): Q<RelationParams>) -> ApiResult<Json<J>> {
    list_params(&st, &me, p, true).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GroupParam {
    relation_type_group: Option<String>,
}

async fn at_path(
    st: &Core,
    me: &Caller,
    dir: Direction,
    path: Vec<String>,
    group: Option<String>,
    info: bool,
) -> ApiResult<Json<J>> {
    let [entity_type, id, rest @ ..] = path.as_slice() else {
        return Err(ApiError::bad_request("an entity type and id are required"));
    };
    let e = EntityRef::of(entity_type, id)?;
    let found = relations::at(st, me, e, dir, rest.first().cloned(), group).await?;
    Ok(render(found, info))
}

/// `GET /api/relations/from/{fromType}/{fromId}` (and `…/{relationType}`).
pub async fn from_path(
    User(me): User,
    State(st): St,
    Path(path): Path<Vec<String>>,
    Q(q): Q<GroupParam>,
) -> ApiResult<Json<J>> {
    at_path(&st, &me, Direction::From, path, q.relation_type_group, false).await
}

/// `GET /api/relations/to/{toType}/{toId}` (and `…/{relationType}`).
pub async fn to_path(
    User(me): User,
    State(st): St,
    Path(path): Path<Vec<String>>,
    Q(q): Q<GroupParam>,
) -> ApiResult<Json<J>> {
    at_path(&st, &me, Direction::To, path, q.relation_type_group, false).await
}

/// `GET /api/relations/info/from/{fromType}/{fromId}`.
pub async fn info_from_path(
    User(me): User,
    State(st): St,
    Path(path): Path<Vec<String>>,
    Q(q): Q<GroupParam>,
) -> ApiResult<Json<J>> {
    at_path(&st, &me, Direction::From, path, q.relation_type_group, true).await
}

/// `GET /api/relations/info/to/{toType}/{toId}`.
pub async fn info_to_path(
    User(me): User,
    State(st): St,
    Path(path): Path<Vec<String>>,
    Q(q): Q<GroupParam>,
) -> ApiResult<Json<J>> {
    at_path(&st, &me, Direction::To, path, q.relation_type_group, true).await
}

/// A client's `EntityRelationsQuery`.
pub(crate) fn parse_query(q: &J) -> ApiResult<RelationsQuery> {
    let mut filters = Vec::new();
    for f in q.get("filters").and_then(J::as_array).into_iter().flatten() {
        let t = f.get("relationType").and_then(J::as_str).map(str::to_owned);
        let kinds = f
            .get("entityTypes")
            .and_then(J::as_array)
            .into_iter()
            .flatten()
            .map(|k| EntityKind::parse(k.as_str().unwrap_or_default()))
            .collect::<Result<Vec<_>, _>>()?;
        filters.push((t, kinds));
    }
    relations_query(q.get("parameters"), filters)
}

/// ThingsBoard's `RelationsSearchParameters` (`rootId`, `rootType`, `direction`,
/// `relationTypeGroup`, `maxLevel`, `fetchLastLevelOnly`) with `filters`.
pub(crate) fn relations_query(
    p: Option<&J>,
    filters: Vec<(Option<String>, Vec<EntityKind>)>,
) -> ApiResult<RelationsQuery> {
    let p = p.ok_or_else(|| ApiError::bad_request("parameters are required"))?;
    let s = |k: &str| p.get(k).and_then(J::as_str);
    let root = EntityRef::of(s("rootType").unwrap_or_default(), s("rootId").unwrap_or_default())?;
    Ok(RelationsQuery {
        root,
        direction: Direction::parse(s("direction").unwrap_or("FROM"))?,
        group: s("relationTypeGroup").map(str::to_owned),
        max_level: p.get("maxLevel").and_then(J::as_u64).unwrap_or(1) as usize,
        last_level_only: p.get("fetchLastLevelOnly").and_then(J::as_bool).unwrap_or(false),
        filters,
    })
}

/// ThingsBoard's asset or device search query (`{"parameters", "relationType",
/// "assetTypes"|"deviceTypes"}`): the relations query to the entities of `kind`, and the
/// types (`types_field`) they must have (none: any).
pub(crate) fn search_query(q: &J, kind: EntityKind, types_field: &str) -> ApiResult<(RelationsQuery, Vec<String>)> {
    let relation_type = q.get("relationType").and_then(J::as_str).map(str::to_owned);
    let types = q
        .get(types_field)
        .and_then(J::as_array)
        .into_iter()
        .flatten()
        .filter_map(|t| Some(t.as_str()?.to_owned()))
        .collect();
    Ok((relations_query(q.get("parameters"), vec![(relation_type, vec![kind])])?, types))
}

/// `POST /api/relations`: a relations query.
pub async fn query(User(me): User, State(st): St, Body(body): Body) -> ApiResult<Json<J>> {
    let q = parse_query(&parse_json(&body)?)?;
    Ok(render(relations::query(&st, &me, q).await?, false))
}

/// `POST /api/relations/info`: a relations query, with the ends' names.
pub async fn query_info(User(me): User, State(st): St, Body(body): Body) -> ApiResult<Json<J>> {
    let q = parse_query(&parse_json(&body)?)?;
    Ok(render(relations::query(&st, &me, q).await?, true))
}
