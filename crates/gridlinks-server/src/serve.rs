//! Running the server: the platform starts (storage, writer, shared services, auth), the
//! listeners bind, the transports start on the platform, then readiness. Shutdown is
//! ordered: not ready → no new connections, in-flight requests finish → device connections
//! acknowledge what is in flight and close → the transports' background work stops → the
//! write queue drains → final sync.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use anyhow::Context;
use gridlinks_listener::tls::{Acceptor, Certs};
use gridlinks_platform::config::Config;
use gridlinks_platform::Platform;
use tokio::net::{TcpListener, UdpSocket};

/// Binds `bind` (`what` names it in errors).
async fn bind_tcp(bind: &str, what: &str) -> anyhow::Result<TcpListener> {
    let addr: SocketAddr = bind.parse().with_context(|| format!("{what}: {bind:?} is not an address"))?;
    TcpListener::bind(addr).await.with_context(|| format!("cannot listen on {addr} ({what})"))
}

/// Binds `bind` unless it is empty (the listener is off).
async fn bind_optional(bind: &str, what: &str) -> anyhow::Result<Option<TcpListener>> {
    Ok(match bind {
        "" => None,
        bind => Some(bind_tcp(bind, what).await?),
    })
}

/// A TLS listener unless `bind` is empty: its socket and handshake (`client_certs`: devices
/// may log in by theirs).
async fn bind_tls(
    bind: &str,
    what: &str,
    certs: Option<&Arc<Certs>>,
    client_certs: bool,
    timeout: std::time::Duration,
) -> anyhow::Result<Option<(TcpListener, Acceptor)>> {
    let Some(listener) = bind_optional(bind, what).await? else { return Ok(None) };
    let certs = certs.context("a TLS listener without tls.cert_file")?;
    Ok(Some((listener, certs.acceptor(client_certs, timeout)?)))
}

/// The TLS listeners' certificate, loaded if any listener speaks TLS, and re-read on every
/// SIGHUP for as long as the server runs (a bad file keeps the certificate in use).
fn load_tls(cfg: &Config) -> anyhow::Result<Option<Arc<Certs>>> {
    if !cfg.tls_used() {
        return Ok(None);
    }
    let certs = Certs::load(&cfg.tls.cert_file, &cfg.tls.key_file).context("loading the TLS certificate")?;
    let reloading = certs.clone();
    let mut hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .context("installing the SIGHUP handler (TLS certificate reload)")?;
    tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            let certs = reloading.clone();
            match tokio::task::spawn_blocking(move || certs.reload()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::error!(error = %e, "TLS certificate not reloaded; the one in use stays"),
                Err(e) => tracing::error!(error = %e, "TLS certificate reload failed"),
            }
        }
    });
    Ok(Some(certs))
}

/// CoAP over DTLS's certificate, re-read on every SIGHUP (a bad file keeps the one in use).
fn reload_on_hangup(dtls: Arc<gridlinks_coap::dtls::Dtls>) -> anyhow::Result<Arc<gridlinks_coap::dtls::Dtls>> {
    let mut hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .context("installing the SIGHUP handler (DTLS certificate reload)")?;
    let reloading = dtls.clone();
    tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            if let Err(e) = reloading.reload() {
                tracing::error!(error = %e, "CoAP DTLS certificate not reloaded; the one in use stays");
            }
        }
    });
    Ok(dtls)
}

/// Runs the server until `shutdown` resolves; returns after the final sync.
pub async fn serve(
    cfg: Config,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let (platform, running) = Platform::start(cfg, stop_rx.clone()).await?;
    let cfg = platform.core.cfg.clone();

    let http_listener = bind_tcp(&cfg.http.bind, "http.bind").await?;
    let http_local = http_listener.local_addr()?;
    let mqtt_listener = bind_tcp(&cfg.mqtt.bind, "mqtt.bind (MQTT)").await?;
    let mqtt_local = mqtt_listener.local_addr()?;
    let ws_listener = bind_optional(&cfg.mqtt.ws_bind, "mqtt.ws_bind (MQTT over WebSocket)").await?;
    let ws_local = ws_listener.as_ref().map(TcpListener::local_addr).transpose()?;
    let certs = load_tls(&cfg)?;
    let timeout = cfg.tls.handshake_timeout.duration();
    let tls_listener = |bind, what, client_certs| bind_tls(bind, what, certs.as_ref(), client_certs, timeout);
    let https = tls_listener(&cfg.http.tls_bind, "http.tls_bind (HTTPS)", cfg.http.tls_client_certs).await?;
    let mqtts = tls_listener(&cfg.mqtt.tls_bind, "mqtt.tls_bind (MQTT over TLS)", true).await?;
    let wss = tls_listener(&cfg.mqtt.wss_bind, "mqtt.wss_bind (MQTT over secure WebSocket)", cfg.mqtt.wss_client_certs)
        .await?;
    let tls_locals: Vec<String> = [("https", &https), ("mqtts", &mqtts), ("wss", &wss)]
        .iter()
        .filter_map(|(name, l)| Some(format!("{name}={}", l.as_ref()?.0.local_addr().ok()?)))
        .collect();
    let coap_socket = match cfg.coap.bind.as_str() {
        "" => None,
        bind => {
            let addr: SocketAddr = bind.parse().context("coap.bind")?;
            Some(UdpSocket::bind(addr).await.with_context(|| format!("cannot listen on {addr} (CoAP, UDP)"))?)
        }
    };
    let coap_local = coap_socket.as_ref().map(UdpSocket::local_addr).transpose()?;
    let coaps = match cfg.coap.dtls_bind.as_str() {
        "" => None,
        bind => {
            let addr: SocketAddr = bind.parse().context("coap.dtls_bind")?;
            let socket =
                UdpSocket::bind(addr).await.with_context(|| format!("cannot listen on {addr} (CoAP over DTLS)"))?;
            let dtls = gridlinks_coap::dtls::Dtls::new(
                cfg.tls.cert_file.clone(),
                cfg.tls.key_file.clone(),
                cfg.coap.max_dtls_sessions,
                timeout,
                cfg.coap.dtls_idle_timeout.duration(),
            )
            .context("CoAP over DTLS")?;
            Some((socket, reload_on_hangup(Arc::new(dtls))?))
        }
    };
    let coaps_local = coaps.as_ref().map(|(s, _)| s.local_addr()).transpose()?;
    let mut tcp_listeners = Vec::with_capacity(cfg.tcp.listeners.len());
    for l in &cfg.tcp.listeners {
        let listener = bind_tcp(&l.bind, &format!("custom TCP protocol {}", l.protocol)).await?;
        let tls = match (&certs, l.tls) {
            (Some(certs), true) => Some(certs.acceptor(false, timeout)?),
            _ => None,
        };
        tcp_listeners.push((listener, tls));
    }

    // Device connections (MQTT and custom TCP) share one limit, and each holds a sender of
    // `alive`: once all have ended, the receiver says so.
    let (alive, mut all_closed) = tokio::sync::mpsc::channel::<()>(1);
    let limit = Arc::new(tokio::sync::Semaphore::new(cfg.mqtt_max_connections()));
    let listeners = gridlinks_mqtt::Listeners { tcp: mqtt_listener, tls: mqtts, ws: ws_listener, wss };
    let mut mqtt = gridlinks_mqtt::start(&platform, listeners, stop_rx.clone(), alive.clone(), limit.clone())?;
    let tcp = gridlinks_tcp::start(&platform, tcp_listeners, stop_rx.clone(), alive, limit)?;
    let coap = (coap_socket.is_some() || coaps.is_some()).then(|| {
        let sockets = gridlinks_coap::Sockets { plain: coap_socket, dtls: coaps };
        tokio::spawn(gridlinks_coap::serve(sockets, platform.clone(), stop_rx.clone()))
    });
    let metrics = bind_optional(&cfg.metrics.bind, "metrics.bind (/metrics)").await?;
    let metrics_local = metrics.as_ref().map(TcpListener::local_addr).transpose()?;
    let listeners = gridlinks_http::Listeners { http: http_listener, https, metrics };
    let http = gridlinks_http::start(&platform, listeners, stop_rx);
    http.status.ready.store(true, Ordering::Release);
    let tcp_locals: Vec<_> = tcp.iter().map(|(name, _)| name.clone()).collect();
    tracing::info!(http = %http_local, mqtt = %mqtt_local, mqtt_ws = ?ws_local, coap = ?coap_local, coaps = ?coaps_local, tcp = ?tcp_locals, tls = ?tls_locals, metrics = ?metrics_local, mqtt_max_connections = cfg.mqtt_max_connections(), data_dir = %cfg.data_dir.display(), console = gridlinks_http::console::embedded(), "gridlinks ready");

    shutdown.await;
    http.status.ready.store(false, Ordering::Release);
    tracing::info!("shutting down: no new connections, finishing in-flight requests");
    let _ = stop.send(true);
    // Device connections stop reading, acknowledge what is in flight, then close.
    platform.devices.sessions.shut_down();
    let mut listeners: Vec<_> = http.tasks.into_iter().map(|task| ("HTTP".to_owned(), task)).collect();
    listeners.extend(mqtt.listeners.drain(..).map(|(what, task)| (what.to_owned(), task)));
    listeners.extend(coap.map(|task| ("CoAP".to_owned(), task)));
    listeners.extend(tcp);
    for (what, task) in listeners {
        if let Err(e) = task.await {
            tracing::error!(listener = what, error = %e, "listener task failed");
        }
    }
    let _ = all_closed.recv().await;
    mqtt.finish().await;
    running.finish(platform).await?;
    tracing::info!("shutdown complete: all acknowledged data is on disk");
    Ok(())
}
