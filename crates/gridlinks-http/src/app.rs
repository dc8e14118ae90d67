//! The HTTP router over the platform: every route of the REST API, the HTTP device API,
//! the WebSocket API and the console; `/healthz`, `/readyz` and `/metrics`; and the
//! routes' paths.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{any, delete, get, post, put};
use axum::Router;
use gridlinks_platform::metrics;
use gridlinks_platform::Core;
use gridlinks_storage::Health;

use crate::state::{Http, Status, BULK_IMPORT_PATH};
use crate::thingsboard::{
    alarms, api, api_keys, assets, claim, customers, dashboards, device_api, entity_query, lookups, ota, profiles,
    relations, tenant_profiles, tenants, users,
};
use crate::thingsboard::{mqtt_clients, notifications, rpc, sinks};

/// The HTTP routes (`/metrics` among them unless `metrics.bind` gives it its own listener:
/// [`metrics_router`]).
pub fn router(state: Http) -> Router {
    let own_metrics = !state.core.cfg.metrics.bind.is_empty();
    let routes = api_router(state.clone());
    match own_metrics {
        true => routes,
        false => routes.merge(metrics_router(state)),
    }
}

/// `/metrics` alone.
pub fn metrics_router(state: Http) -> Router {
    Router::new().route("/metrics", get(metrics_text)).with_state(state)
}

fn api_router(state: Http) -> Router {
    let body_limit = state.core.cfg.http.max_body_bytes;
    let import_limit = state.core.cfg.http.max_import_bytes;
    let ota_limit = state.core.cfg.ota.max_package_bytes + ota::FRAMING_BYTES;
    let tel = "/api/plugins/telemetry/{entity_type}/{id}";
    // ThingsBoard's HTTP device API by token; with client certificates over HTTPS also
    // without it, where the certificate names the device (`device_api::Device`).
    let devices: &[&str] =
        if state.core.cfg.http.tls_client_certs { &["/api/v1/{token}", "/api/v1"] } else { &["/api/v1/{token}"] };
    let mut app = Router::new()
        .route("/", get(crate::console::index))
        .route("/assets/{file}", get(crate::console::asset))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/api/ws", get(crate::ws::upgrade))
        .route("/api/ws/plugins/telemetry", get(crate::ws::upgrade_legacy))
        .route("/api/auth/login", post(api::login))
        .route("/api/auth/token", post(api::refresh))
        .route("/api/auth/logout", post(api::logout))
        .route("/api/auth/user", get(users::current))
        .route("/api/auth/changePassword", post(users::change_password))
        .route("/api/noauth/activate", post(users::activate).get(users::activate_page))
        .route("/api/user", post(users::save))
        .route("/api/user/{id}", get(users::get).delete(users::delete))
        .route("/api/user/{id}/activationLink", get(users::get_activation_link))
        .route("/api/user/{id}/activationLinkInfo", get(users::get_activation_link_info))
        .route("/api/users", get(users::list))
        .route("/api/tenant", post(tenants::save))
        .route("/api/tenant/{id}", get(tenants::get).delete(tenants::delete))
        .route("/api/tenant/{id}/users", get(users::of_tenant))
        .route("/api/tenants", get(tenants::list))
        .route("/api/tenantProfile", post(tenant_profiles::save))
        .route("/api/tenantProfile/{id}", get(tenant_profiles::get).delete(tenant_profiles::delete))
        .route("/api/tenantProfile/{id}/default", post(tenant_profiles::set_default))
        .route("/api/tenantProfileInfo/default", get(tenant_profiles::default_info))
        .route("/api/tenantProfileInfo/{id}", get(tenant_profiles::get_info))
        .route("/api/tenantProfiles", get(tenant_profiles::list))
        .route("/api/tenantProfiles/list", get(tenant_profiles::by_ids))
        .route("/api/tenantProfileInfos", get(tenant_profiles::list_infos))
        .route("/api/customer/{customer}/users", get(users::of_customer))
        .route("/api/deviceProfiles", get(profiles::list))
        .route("/api/deviceProfileInfos", get(profiles::infos))
        .route("/api/deviceProfile", post(profiles::save))
        .route("/api/deviceProfile/names", get(profiles::names))
        .route("/api/deviceProfile/{id}", get(profiles::get).delete(profiles::delete))
        .route("/api/deviceProfile/{id}/default", post(profiles::set_default))
        .route("/api/deviceProfileInfo/default", get(profiles::default_info))
        .route("/api/deviceProfileInfo/{id}", get(profiles::info))
        .route("/api/apiKey", post(api_keys::create))
        .route("/api/apiKeys/{user}", get(api_keys::list))
        .route("/api/apiKey/{id}", delete(api_keys::delete))
        .route("/api/apiKey/{id}/enabled/{enabled}", put(api_keys::set_enabled))
        .route("/api/apiKey/{id}/description", put(api_keys::set_description))
        .route("/api/customer", post(customers::save))
        .route("/api/customer/{id}", get(customers::get).delete(customers::delete))
        .route("/api/customers", get(customers::list))
        .route("/api/tenant/customers", get(customers::by_title))
        .route("/api/customer/{customer}/device/{device}", post(customers::assign))
        .route("/api/customer/device/{device}", delete(customers::unassign))
        .route("/api/customer/device/{device}/claim", post(claim::claim).delete(claim::reclaim))
        .route("/api/owner/{kind}/{owner}/{entity_type}/{entity}", post(customers::change_owner))
        .route("/api/customer/{customer}/devices", get(customers::devices))
        .route("/api/customer/{customer}/deviceInfos", get(customers::device_infos))
        .route("/api/customer/info/{id}", get(lookups::customer_info))
        .route("/api/customer/{id}/title", get(lookups::customer_title))
        .route("/api/customer/{id}/shortInfo", get(lookups::customer_short_info))
        .route("/api/customers/list", get(lookups::customers_by_ids))
        .route("/api/device/info/{id}", get(lookups::device_info))
        .route("/api/devices", get(lookups::devices_by_ids).post(lookups::devices_by_query))
        .route("/api/devices/count/{ota_type}/{profile}", get(lookups::count_without_ota))
        .route("/api/deviceProfile/devices/keys/timeseries", get(lookups::profile_ts_keys))
        .route("/api/deviceProfile/devices/keys/attributes", get(lookups::profile_attr_keys))
        .route("/api/deviceProfileInfos/list", get(lookups::profile_infos_by_ids))
        .route("/api/dashboards", get(lookups::dashboards_by_ids))
        .route("/api/dashboard/serverTime", get(lookups::server_time))
        .route("/api/dashboard/maxDatapointsLimit", get(lookups::max_datapoints_limit))
        .route("/api/users/list", get(lookups::users_by_ids))
        .route("/api/entitiesQuery/find/keys", post(lookups::entity_keys))
        .route("/api/v2/entitiesQuery/find/keys", post(lookups::entity_keys_v2))
        .route(
            "/api/customer/{customer}/dashboard/{dashboard}",
            post(customers::assign_dashboard_to).delete(customers::unassign_dashboard_from),
        )
        .route("/api/customer/{customer}/dashboards", get(customers::dashboards_of))
        .route("/api/dashboard", post(dashboards::save))
        .route("/api/dashboard/{id}", get(dashboards::get).delete(dashboards::delete))
        .route("/api/dashboard/info/{id}", get(dashboards::info))
        .route("/api/tenant/dashboards", get(dashboards::list))
        .route("/api/otaPackage", post(ota::save))
        .route(
            "/api/otaPackage/{id}",
            get(ota::info).post(ota::upload).delete(ota::delete).layer(DefaultBodyLimit::max(ota_limit)),
        )
        .route("/api/otaPackage/info/{id}", get(ota::info))
        .route("/api/otaPackage/{id}/download", get(ota::download))
        .route("/api/otaPackages", get(ota::list))
        .route("/api/otaPackages/{profile}/{type}", get(ota::list_for))
        .route("/api/ruleChains", any(profiles::rule_engine))
        .route("/api/ruleChain", any(profiles::rule_engine))
        .route("/api/ruleChain/{*rest}", any(profiles::rule_engine))
        .route("/api/ruleNode/{*rest}", any(profiles::rule_engine))
        .route("/api/device", post(api::save_device))
        .route("/api/device/{id}", get(api::get_device).delete(api::delete_device))
        .route("/api/device/{id}/credentials", get(api::get_credentials))
        .route("/api/device-with-credentials", post(api::save_device_with_credentials))
        .route("/api/device/credentials", post(api::save_credentials))
        .route(BULK_IMPORT_PATH, post(api::bulk_import).layer(DefaultBodyLimit::max(import_limit)))
        .route("/api/tenant/devices", get(api::list_devices))
        .route("/api/tenant/device", get(api::list_devices))
        .route("/api/tenant/deviceInfos", get(api::list_device_infos))
        .route("/api/deviceInfos/all", get(api::list_device_infos))
        .route("/api/device/types", get(api::device_types))
        .route("/api/relation", post(relations::save).delete(relations::delete).get(relations::get))
        .route("/api/v2/relation", post(relations::save_v2).delete(relations::delete_v2))
        .route("/api/relations", get(relations::list).post(relations::query).delete(relations::delete_all))
        .route("/api/relations/info", get(relations::list_info).post(relations::query_info))
        .route("/api/relations/from/{from_type}/{from_id}", get(relations::from_path))
        .route("/api/relations/from/{from_type}/{from_id}/{relation_type}", get(relations::from_path))
        .route("/api/relations/to/{to_type}/{to_id}", get(relations::to_path))
        .route("/api/relations/to/{to_type}/{to_id}/{relation_type}", get(relations::to_path))
        .route("/api/relations/info/from/{from_type}/{from_id}", get(relations::info_from_path))
        .route("/api/relations/info/to/{to_type}/{to_id}", get(relations::info_to_path))
        .route("/api/entitiesQuery/find", post(entity_query::find))
        .route("/api/entitiesQuery/count", post(entity_query::count))
        .route("/api/notification/deliveryMethods", get(notifications::delivery_methods))
        .route(
            "/api/notification/{kind}",
            get(notifications::list).post(notifications::save).delete(notifications::delete_notification),
        )
        .route(
            "/api/notification/{kind}/{id}",
            get(notifications::get).delete(notifications::delete).put(notifications::read),
        )
        .route("/api/forwarding/sink", post(sinks::save))
        .route("/api/forwarding/sink/{id}", get(sinks::get).delete(sinks::delete))
        .route("/api/forwarding/sinks", get(sinks::list))
        .route("/api/notifications", get(notifications::inbox))
        .route("/api/notifications/unread/count", get(notifications::unread))
        .route("/api/notifications/read", put(notifications::read_all))
        .route("/api/alarm", post(alarms::save))
        .route("/api/alarm/rule", any(alarms::alarm_rules))
        .route("/api/alarm/rule/{*rest}", any(alarms::alarm_rules))
        .route("/api/alarm/rules", any(alarms::alarm_rules))
        .route("/api/alarm/rules/{*rest}", any(alarms::alarm_rules))
        .route("/api/alarmsQuery/find", post(entity_query::find_alarms))
        .route("/api/alarmsQuery/count", post(entity_query::count_alarms))
        .route("/api/users/assign/{id}", get(alarms::users_for_assign))
        .route("/api/alarm/{id}", get(alarms::get).delete(alarms::delete))
        .route("/api/alarm/info/{id}", get(alarms::info))
        .route("/api/alarm/types", get(alarms::types))
        .route("/api/alarm/highestSeverity/{entityType}/{entityId}", get(alarms::highest_severity))
        .route("/api/alarm/{id}/ack", post(alarms::ack))
        .route("/api/alarm/{id}/clear", post(alarms::clear))
        .route("/api/alarm/{id}/assign", delete(alarms::unassign))
        .route("/api/alarm/{id}/assign/{user}", post(alarms::assign))
        .route("/api/alarm/{id}/comment", get(alarms::comments).post(alarms::save_comment))
        .route("/api/alarm/{id}/comment/{comment}", delete(alarms::delete_comment))
        .route("/api/alarm/{id}/{entityId}", get(alarms::by_originator))
        .route("/api/alarms", get(alarms::all))
        .route("/api/v2/alarm/{entityType}/{entityId}", get(alarms::by_originator_v2))
        .route("/api/v2/alarms", get(alarms::all_v2))
        .route("/api/asset", post(assets::save))
        .route("/api/asset/{id}", get(assets::get).delete(assets::delete))
        .route("/api/asset/info/{id}", get(assets::info))
        .route("/api/asset/types", get(assets::types))
        .route("/api/assets", get(assets::by_ids).post(assets::by_query))
        .route("/api/tenant/assets", get(assets::tenant_assets))
        .route("/api/tenant/asset", get(assets::tenant_asset))
        .route("/api/tenant/assetInfos", get(assets::tenant_asset_infos))
        .route("/api/assetInfos/all", get(assets::tenant_asset_infos))
        .route("/api/user/assets", get(assets::user_assets))
        .route("/api/customer/{customer}/assets", get(assets::customer_assets))
        .route("/api/customer/{customer}/assetInfos", get(assets::customer_asset_infos))
        .route("/api/customer/{customer}/asset/{asset}", post(assets::assign_to))
        .route("/api/customer/asset/{asset}", delete(assets::unassign))
        .route("/api/assetProfile", post(assets::save_profile))
        .route("/api/assetProfile/names", get(assets::profile_names))
        .route("/api/assetProfile/{id}", get(assets::get_profile).delete(assets::delete_profile))
        .route("/api/assetProfile/{id}/default", post(assets::set_default_profile))
        .route("/api/assetProfileInfo/{id}", get(assets::profile_info))
        .route("/api/assetProfiles", get(assets::profiles))
        .route("/api/assetProfileInfos", get(assets::profile_infos))
        .route("/api/assetProfileInfos/list", get(assets::profiles_by_ids))
        .route(&format!("{tel}/values/timeseries"), get(api::get_timeseries))
        .route(&format!("{tel}/values/timeseries/history"), get(api::get_timeseries_history))
        .route(&format!("{tel}/keys/timeseries"), get(api::ts_keys))
        .route(&format!("{tel}/keys/attributes"), get(api::attr_keys))
        .route(&format!("{tel}/keys/attributes/{{scope}}"), get(api::attr_keys_scope))
        .route(&format!("{tel}/values/attributes"), get(api::get_attributes))
        .route(&format!("{tel}/values/attributes/{{scope}}"), get(api::get_attributes_scope))
        .route(&format!("{tel}/attributes/{{scope}}"), post(api::post_attributes))
        .route(&format!("{tel}/timeseries/delete"), delete(api::delete_timeseries))
        .route(&format!("{tel}/timeseries/{{scope}}"), post(api::post_timeseries))
        .route(&format!("{tel}/{{scope}}"), delete(api::delete_attributes).post(api::post_attributes))
        // ThingsBoard's older device-only form: /api/plugins/telemetry/{deviceId}/{scope}.
        .route(tel, post(api::post_device_attributes).delete(api::delete_device_attributes))
        .route("/api/plugins/rpc/{kind}/{device_id}", post(rpc::rpc_v1))
        .route("/api/rpc/{kind}/{device_id}", post(rpc::rpc_v2))
        .route("/api/mqtt/clients", post(mqtt_clients::save).get(mqtt_clients::list))
        .route("/api/mqtt/clients/{username}", get(mqtt_clients::get).delete(mqtt_clients::delete))
        .route("/api/v1/provision", post(device_api::provision));
    for d in devices {
        app = app
            .route(&format!("{d}/telemetry"), post(device_api::post_telemetry))
            .route(&format!("{d}/attributes"), post(device_api::post_attributes).get(device_api::get_attributes))
            .route(&format!("{d}/attributes/updates"), get(device_api::poll_attributes))
            .route(&format!("{d}/rpc"), get(device_api::poll_rpc).post(device_api::client_rpc))
            .route(&format!("{d}/rpc/{{request_id}}"), post(device_api::rpc_reply))
            .route(&format!("{d}/firmware"), get(ota::device_firmware))
            .route(&format!("{d}/software"), get(ota::device_software))
            .route(&format!("{d}/claim"), post(device_api::post_claim));
    }
    app.fallback(api::not_found).layer(DefaultBodyLimit::max(body_limit)).with_state(state)
}

/// `GET /healthz`: 200 while the server takes data; 503 before it is ready, while shutting
/// down, and while storage refuses writes (disk full, or reopening after a failure) — reads
/// keep working then. The node's own state only: a liveness check.
async fn healthz(State(core): State<Arc<Core>>, State(status): State<Arc<Status>>) -> impl IntoResponse {
    let (up, body) = local_health(&core, &status);
    answer(up, body)
}

/// `GET /readyz`: `/healthz` and the shared services (`backends`: Kafka, PostgreSQL, each
/// `"UP"` or `"DOWN: why"`): 503 while any is down, when the node refuses new work. A
/// load balancer's readiness check. `storage_lag`: records in Kafka not stored yet.
async fn readyz(State(core): State<Arc<Core>>, State(status): State<Arc<Status>>) -> impl IntoResponse {
    let (up, mut body) = local_health(&core, &status);
    body.insert("backends".into(), core.backends.report().into());
    body.insert("storage_lag".into(), core.backends.lag().into());
    answer(up && core.backends.refusal().is_none(), body)
}

/// Whether the node itself takes data, and the body saying so.
fn local_health(core: &Core, status: &Status) -> (bool, serde_json::Map<String, serde_json::Value>) {
    let health = core.store.health();
    let storage = match health {
        Health::Ok => "OK",
        Health::DiskFull => "DISK_FULL",
        Health::Failed => "FAILED",
    };
    let up = status.ready.load(Ordering::Acquire) && health == Health::Ok;
    (up, serde_json::Map::from_iter([("storage".to_owned(), storage.into())]))
}

/// 200 `{"status":"UP",…}` or 503 `{"status":"DOWN",…}`.
fn answer(up: bool, mut body: serde_json::Map<String, serde_json::Value>) -> impl IntoResponse {
    body.insert("status".into(), if up { "UP" } else { "DOWN" }.into());
    let code = if up { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (code, axum::Json(serde_json::Value::Object(body)))
}

/// `GET /metrics`: OpenMetrics text of every registered source; with `metrics.token`, for
/// a scrape that sends it as a bearer token only.
pub async fn metrics_text(State(st): State<Http>, headers: axum::http::HeaderMap) -> axum::response::Response {
    let token = &st.core.cfg.metrics.token;
    if !token.is_empty() {
        let sent =
            headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
        let ok = sent.is_some_and(|s| {
            s.len() == token.len() && s.bytes().zip(token.bytes()).fold(0u8, |d, (a, b)| d | (a ^ b)) == 0
        });
        if !ok {
            return (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, "Bearer")], "metrics.token required")
                .into_response();
        }
    }
    match st.platform.metrics.render() {
        Ok(body) => ([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], body).into_response(),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "cannot encode the metrics").into_response(),
    }
}
