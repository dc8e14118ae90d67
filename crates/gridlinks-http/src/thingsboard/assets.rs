//! Assets and asset profiles, as ThingsBoard's REST API serves them (tb-rest-client's
//! asset and asset-profile calls): save, read, list (tenant, customer, by name, by ids,
//! by relation), delete, assign to customers, asset types; profiles with their default.
//! An asset's attributes and time series use the same telemetry API as a device's, with
//! entity type `ASSET`.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use gridlinks_platform::auth::Caller;
use gridlinks_platform::entities::assets::{self, AssetSave};
use gridlinks_platform::entities::relations::{self, EntityKind};
use gridlinks_platform::Core;
use gridlinks_storage::{DocKind, DocRecord};
use gridlinks_thingsboard::model;
use serde::Deserialize;
use serde_json::{json, Value as J};
use uuid::Uuid;

use super::api::{blocking, body_id, parse_json, uuid};
use super::error::{ApiError, ApiResult};
use super::extract::{lenient_bool, Admin, Body, User, Q};
use super::paging::{descending, page_link, page_of, DocListParams};

type St = State<Arc<Core>>;

/// What rendering an asset needs besides it: profile names and customer titles.
struct Names {
    profiles: Vec<DocRecord>,
    customers: Vec<DocRecord>,
}

impl Names {
    async fn load(st: &Core) -> ApiResult<Self> {
        let store = st.store.clone();
        blocking(move || {
            Ok(Self { profiles: store.docs(DocKind::AssetProfile)?, customers: store.docs(DocKind::Customer)? })
        })
        .await
    }

    fn profile(&self, a: &DocRecord) -> (Uuid, &str) {
        let id = assets::profile_id(a).unwrap_or_default();
        (id, self.profiles.iter().find(|p| p.id == id).map_or(assets::DEFAULT_PROFILE, |p| p.title.as_str()))
    }

    fn customer(&self, a: &DocRecord) -> Option<(Uuid, &str)> {
        let id = assets::customer(a)?;
        Some((id, self.customers.iter().find(|c| c.id == id).map_or("", |c| c.title.as_str())))
    }

    fn render(&self, st: &Core, a: &DocRecord, info: bool) -> J {
        let view = model::Asset {
            id: a.id,
            created_time: a.created_time,
            name: &a.title,
            profile: self.profile(a),
            customer: self.customer(a),
            doc: &a.doc,
        };
        match info {
            true => model::asset_info(&view, st.doc_tenant(a)),
            false => model::asset(&view, st.doc_tenant(a)),
        }
    }
}

async fn render_one(st: &Core, a: &DocRecord, info: bool) -> ApiResult<Json<J>> {
    Ok(Json(Names::load(st).await?.render(st, a, info)))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AssetBody {
    name: Option<String>,
    #[serde(rename = "type")]
    asset_type: Option<String>,
    label: Option<J>,
    additional_info: Option<J>,
    asset_profile_id: Option<model::Id>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SaveParams {
    name_conflict_policy: Option<String>,
    uniquify_separator: Option<String>,
    uniquify_strategy: Option<String>,
    entity_group_id: Option<String>,
    entity_group_ids: Option<String>,
}

/// `POST /api/asset`: create, or update when the body has an id.
pub async fn save(Admin(me): Admin, State(st): St, Q(p): Q<SaveParams>, Body(body): Body) -> ApiResult<Json<J>> {
    if p.name_conflict_policy.as_deref().is_some_and(|p| p != "FAIL") {
        return Err(ApiError::bad_request("nameConflictPolicy: only FAIL is supported"));
    }
    let _ = (p.uniquify_separator, p.uniquify_strategy);
    if p.entity_group_id.is_some() || p.entity_group_ids.is_some() {
        return Err(ApiError::bad_request("entity groups are a ThingsBoard PE feature GridLinks does not have"));
    }
    let doc: J = parse_json(&body)?;
    let id = body_id(&doc, |s| uuid(s, "asset"))?;
    let b: AssetBody =
        serde_json::from_value(doc).map_err(|e| ApiError::bad_request(format!("Invalid request body: {e}")))?;
    let profile = b.asset_profile_id.map(|p| uuid(&p.id, "asset profile")).transpose()?;
    let save = AssetSave {
        id,
        name: b.name.unwrap_or_default(),
        asset_type: b.asset_type,
        profile,
        label: b.label.unwrap_or(J::Null),
        additional_info: b.additional_info.unwrap_or(J::Null),
    };
    let a = assets::save(&st, &me, save).await?;
    render_one(&st, &a, false).await
}

/// `GET /api/asset/{id}`.
pub async fn get(User(me): User, State(st): St, Path(id): Path<String>) -> ApiResult<Json<J>> {
    let a = assets::get(&st, &me, uuid(&id, "asset")?).await?;
    render_one(&st, &a, false).await
}

/// `GET /api/asset/info/{id}`.
pub async fn info(User(me): User, State(st): St, Path(id): Path<String>) -> ApiResult<Json<J>> {
    let a = assets::get(&st, &me, uuid(&id, "asset")?).await?;
    render_one(&st, &a, true).await
}

/// `DELETE /api/asset/{id}`: with its attributes, time series and relations.
pub async fn delete(Admin(me): Admin, State(st): St, Path(id): Path<String>) -> ApiResult<StatusCode> {
    assets::delete(&st, &me, uuid(&id, "asset")?).await?;
    Ok(StatusCode::OK)
}

/// The parameters of an asset list.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ListParams {
    page_size: Option<i64>,
    page: Option<i64>,
    #[serde(rename = "type")]
    asset_type: Option<String>,
    asset_profile_id: Option<String>,
    text_search: Option<String>,
    sort_property: Option<String>,
    sort_order: Option<String>,
    /// `/api/tenant/assets?assetName=`: the one asset of that name.
    asset_name: Option<String>,
    /// Assets assigned to customers are the tenant's too: changes nothing.
    #[serde(rename = "includeCustomers")]
    #[serde(default, deserialize_with = "lenient_bool")]
    _include_customers: Option<bool>,
}

/// A page of `all` (visible to the caller already) as `p` asks; infos or plain assets.
async fn page(st: &Core, mut all: Vec<DocRecord>, p: ListParams, info: bool) -> ApiResult<Json<J>> {
    let (Some(size), Some(number)) = (p.page_size, p.page) else {
        return Err(ApiError::bad_request("Required request parameters 'pageSize' and 'page' are missing"));
    };
    let link = page_link(st, size, number)?;
    let desc = descending(p.sort_order.as_deref())?;
    let names = Names::load(st).await?;
    if let Some(t) = p.asset_type.filter(|t| !t.is_empty()) {
        all.retain(|a| names.profile(a).1 == t);
    }
    if let Some(profile) = p.asset_profile_id {
        let profile = uuid(&profile, "asset profile")?;
        all.retain(|a| assets::profile_id(a) == Some(profile));
    }
    if let Some(q) = p.text_search.map(|q| q.to_lowercase()).filter(|q| !q.is_empty()) {
        let label = |a: &DocRecord| a.doc.get("label").and_then(J::as_str).unwrap_or_default().to_lowercase();
        all.retain(|a| a.title.to_lowercase().contains(&q) || label(a).contains(&q));
    }
    let text = |a: &DocRecord, k: &str| a.doc.get(k).and_then(J::as_str).unwrap_or_default().to_owned();
    match p.sort_property.as_deref().unwrap_or("name") {
        "name" => {}
        "createdTime" => all.sort_by_key(|a| a.created_time),
        "type" | "assetProfileName" => all.sort_by(|a, b| names.profile(a).1.cmp(names.profile(b).1)),
        "label" => all.sort_by_key(|a| text(a, "label")),
        "customerTitle" => all.sort_by(|a, b| names.customer(a).map(|c| c.1).cmp(&names.customer(b).map(|c| c.1))),
        other => {
            return Err(ApiError::bad_request(format!(
                "Invalid sort property '{other}': use name, createdTime, type, label or customerTitle"
            )))
        }
    }
    if desc {
        all.reverse();
    }
    Ok(Json(page_of(&all, link, |a| names.render(st, a, info))))
}

async fn of_tenant(st: &Core, me: &Caller) -> ApiResult<Vec<DocRecord>> {
    Ok(assets::visible(st, me).await?)
}

/// `GET /api/tenant/assets?pageSize=&page=[&type=&textSearch=&sortProperty=&sortOrder=]`, or
/// `?assetName=` for one asset.
pub async fn tenant_assets(Admin(me): Admin, State(st): St, Q(p): Q<ListParams>) -> ApiResult<Json<J>> {
    if let Some(name) = p.asset_name.clone() {
        return by_name(&st, &me, name).await;
    }
    let all = of_tenant(&st, &me).await?;
    page(&st, all, p, false).await
}

/// `GET /api/tenant/assetInfos` and `/api/assetInfos/all`: asset infos (customer title,
/// profile name).
pub async fn tenant_asset_infos(Admin(me): Admin, State(st): St, Q(p): Q<ListParams>) -> ApiResult<Json<J>> {
    let all = of_tenant(&st, &me).await?;
    page(&st, all, p, true).await
}

/// `GET /api/user/assets`: the assets the caller may see.
pub async fn user_assets(User(me): User, State(st): St, Q(p): Q<ListParams>) -> ApiResult<Json<J>> {
    let all = of_tenant(&st, &me).await?;
    page(&st, all, p, false).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NameParam {
    asset_name: String,
}

/// `GET /api/tenant/asset?assetName=`.
pub async fn tenant_asset(Admin(me): Admin, State(st): St, Q(p): Q<NameParam>) -> ApiResult<Json<J>> {
    by_name(&st, &me, p.asset_name).await
}

async fn by_name(st: &Core, me: &Caller, name: String) -> ApiResult<Json<J>> {
    let a = of_tenant(st, me)
        .await?
        .into_iter()
        .find(|a| a.title == name)
        .ok_or_else(|| ApiError::not_found("Requested item wasn't found!"))?;
    render_one(st, &a, false).await
}

async fn of_customer(st: &Core, me: &Caller, customer: &str) -> ApiResult<Vec<DocRecord>> {
    let customer = gridlinks_platform::entities::customers::get(st, me, uuid(customer, "customer")?).await?.id;
    let mut all = of_tenant(st, me).await?;
    all.retain(|a| assets::customer(a) == Some(customer));
    Ok(all)
}

/// `GET /api/customer/{customerId}/assets?pageSize=&page=…`.
pub async fn customer_assets(
    User(me): User,
    State(st): St,
    Path(customer): Path<String>,
    Q(p): Q<ListParams>,
) -> ApiResult<Json<J>> {
    let all = of_customer(&st, &me, &customer).await?;
    page(&st, all, p, false).await
}

/// `GET /api/customer/{customerId}/assetInfos?pageSize=&page=…`.
pub async fn customer_asset_infos(
    User(me): User,
    State(st): St,
    Path(customer): Path<String>,
    Q(p): Q<ListParams>,
) -> ApiResult<Json<J>> {
    let all = of_customer(&st, &me, &customer).await?;
    page(&st, all, p, true).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct IdsParam {
    asset_ids: String,
}

/// `GET /api/assets?assetIds=a,b`: those of them the caller may see.
pub async fn by_ids(User(me): User, State(st): St, Q(p): Q<IdsParam>) -> ApiResult<Json<J>> {
    let ids = p.asset_ids.split(',').map(|s| uuid(s.trim(), "asset")).collect::<ApiResult<Vec<_>>>()?;
    let names = Names::load(&st).await?;
    let all = of_tenant(&st, &me).await?;
    Ok(Json(J::Array(all.iter().filter(|a| ids.contains(&a.id)).map(|a| names.render(&st, a, false)).collect())))
}

/// `POST /api/assets` (`AssetSearchQuery`): the assets related to a root entity, of the
/// given relation type and asset types.
pub async fn by_query(User(me): User, State(st): St, Body(body): Body) -> ApiResult<Json<J>> {
    let (query, types) = super::relations::search_query(&parse_json(&body)?, EntityKind::Asset, "assetTypes")?;
    let found = relations::reached(&st, &me, query, EntityKind::Asset).await?;
    let names = Names::load(&st).await?;
    let visible = of_tenant(&st, &me).await?;
    let out = found
        .iter()
        .filter_map(|id| visible.iter().find(|a| a.id == *id))
        .filter(|a| types.is_empty() || types.iter().any(|t| t == names.profile(a).1))
        .map(|a| names.render(&st, a, false))
        .collect();
    Ok(Json(J::Array(out)))
}

/// `GET /api/asset/types`: the types (profile names) of the caller's tenant's assets, as
/// ThingsBoard's `EntitySubtype` list, by name.
pub async fn types(Admin(me): Admin, State(st): St) -> ApiResult<Json<J>> {
    let names = Names::load(&st).await?;
    let mut types: Vec<&str> = Vec::new();
    let all = of_tenant(&st, &me).await?;
    for a in &all {
        types.push(names.profile(a).1);
    }
    types.sort_unstable();
    types.dedup();
    let owner = model::entity_id("TENANT", me.tenant);
    Ok(Json(J::Array(
        types.into_iter().map(|t| json!({"tenantId": owner, "entityType": "ASSET", "type": t})).collect(),
    )))
}

/// Assigns asset `asset` to `customer` (or none): the asset as it is now.
pub(crate) async fn assign(st: &Core, me: &Caller, asset: &str, customer: Option<Uuid>) -> ApiResult<Json<J>> {
    let a = assets::assign_customer(st, me, uuid(asset, "asset")?, customer).await?;
    render_one(st, &a, false).await
}

/// `POST /api/customer/{customerId}/asset/{assetId}`.
pub async fn assign_to(
    Admin(me): Admin,
    State(st): St,
    Path((customer, asset)): Path<(String, String)>,
) -> ApiResult<Json<J>> {
    assign(&st, &me, &asset, Some(uuid(&customer, "customer")?)).await
}

/// `DELETE /api/customer/asset/{assetId}`.
pub async fn unassign(Admin(me): Admin, State(st): St, Path(asset): Path<String>) -> ApiResult<Json<J>> {
    assign(&st, &me, &asset, None).await
}

// ---- asset profiles ---------------------------------------------------------------

fn profile_json(st: &Core, p: &DocRecord) -> J {
    model::asset_profile(p.id, p.created_time, &p.title, &p.doc, st.doc_tenant(p))
}

fn profile_info_json(st: &Core, p: &DocRecord) -> J {
    model::asset_profile_info(p.id, &p.title, &p.doc, st.doc_tenant(p))
}

/// `POST /api/assetProfile`.
pub async fn save_profile(Admin(me): Admin, State(st): St, Body(body): Body) -> ApiResult<Json<J>> {
    let doc: J = parse_json(&body)?;
    let id = body_id(&doc, |s| uuid(s, "asset profile"))?;
    let name = doc.get("name").and_then(J::as_str).unwrap_or_default().to_owned();
    let p = assets::save_profile(&st, &me, id, name, doc).await?;
    Ok(Json(profile_json(&st, &p)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct InlineImages {
    #[serde(rename = "inlineImages")]
    #[serde(default, deserialize_with = "lenient_bool")]
    _inline_images: Option<bool>,
}

/// `GET /api/assetProfile/{id}`.
pub async fn get_profile(
    Admin(me): Admin,
    State(st): St,
    Path(id): Path<String>,
    Q(_): Q<InlineImages>,
) -> ApiResult<Json<J>> {
    let p = assets::get_profile(&st, &me, uuid(&id, "asset profile")?).await?;
    Ok(Json(profile_json(&st, &p)))
}

/// `GET /api/assetProfileInfo/{id}`, or `default` for the tenant's default.
pub async fn profile_info(Admin(me): Admin, State(st): St, Path(id): Path<String>) -> ApiResult<Json<J>> {
    let p = match id.as_str() {
        "default" => assets::default_profile(&st, &me).await?,
        id => assets::get_profile(&st, &me, uuid(id, "asset profile")?).await?,
    };
    Ok(Json(profile_info_json(&st, &p)))
}

/// `DELETE /api/assetProfile/{id}`: not the default, nor one an asset uses.
pub async fn delete_profile(Admin(me): Admin, State(st): St, Path(id): Path<String>) -> ApiResult<StatusCode> {
    assets::delete_profile(&st, &me, uuid(&id, "asset profile")?).await?;
    Ok(StatusCode::OK)
}

/// `POST /api/assetProfile/{id}/default`.
pub async fn set_default_profile(Admin(me): Admin, State(st): St, Path(id): Path<String>) -> ApiResult<Json<J>> {
    let p = assets::set_default_profile(&st, &me, uuid(&id, "asset profile")?).await?;
    Ok(Json(profile_json(&st, &p)))
}

async fn profile_page(st: &Core, me: &Caller, p: DocListParams, info: bool) -> ApiResult<Json<J>> {
    // Made when missing, so a fresh tenant lists its default.
    assets::profiles(st, me).await?;
    let mine = |d: &DocRecord| st.doc_tenant(d) == me.tenant;
    let render = |d: &DocRecord| if info { profile_info_json(st, d) } else { profile_json(st, d) };
    Ok(Json(super::paging::doc_page(st, DocKind::AssetProfile, p, mine, render).await?))
}

/// `GET /api/assetProfiles?pageSize=&page=…`.
pub async fn profiles(Admin(me): Admin, State(st): St, Q(p): Q<DocListParams>) -> ApiResult<Json<J>> {
    profile_page(&st, &me, p, false).await
}

/// `GET /api/assetProfileInfos?pageSize=&page=…`.
pub async fn profile_infos(Admin(me): Admin, State(st): St, Q(p): Q<DocListParams>) -> ApiResult<Json<J>> {
    profile_page(&st, &me, p, true).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NamesParams {
    #[serde(default, deserialize_with = "lenient_bool")]
    active_only: Option<bool>,
}

/// `GET /api/assetProfile/names?activeOnly=`: `{id, name}` of each profile (with
/// `activeOnly`, those some asset uses).
pub async fn profile_names(Admin(me): Admin, State(st): St, Q(p): Q<NamesParams>) -> ApiResult<Json<J>> {
    let profiles = assets::profiles(&st, &me).await?;
    let used = match p.active_only.unwrap_or(false) {
        true => Some(of_tenant(&st, &me).await?.iter().filter_map(assets::profile_id).collect::<Vec<_>>()),
        false => None,
    };
    Ok(Json(J::Array(
        profiles
            .iter()
            .filter(|p| used.as_ref().is_none_or(|u| u.contains(&p.id)))
            .map(|p| json!({"id": model::entity_id("ASSET_PROFILE", p.id), "name": p.title}))
            .collect(),
    )))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProfileIds {
    asset_profile_ids: String,
}

/// `GET /api/assetProfileInfos/list?assetProfileIds=a,b`.
pub async fn profiles_by_ids(Admin(me): Admin, State(st): St, Q(p): Q<ProfileIds>) -> ApiResult<Json<J>> {
    let ids = p.asset_profile_ids.split(',').map(|s| uuid(s.trim(), "asset profile")).collect::<ApiResult<Vec<_>>>()?;
    let profiles = assets::profiles(&st, &me).await?;
    Ok(Json(J::Array(profiles.iter().filter(|p| ids.contains(&p.id)).map(|p| profile_info_json(&st, p)).collect())))
}
