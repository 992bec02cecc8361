//! A deliberately tiny HTTP/1.1 responder for `/metrics`, `/healthz` and
//! `/readyz`: one request per connection, then close. Prometheus, kubelet
//! probes and curl need no more, and it keeps a web framework out of the
//! relay.

use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::export;
use super::health::Health;

/// Longest request head read; a probe's is a few hundred bytes.
const MAX_HEAD: usize = 8 * 1024;
/// A client gets this long to send its request and read the answer, so a
/// stuck client cannot pin a task.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(10);

const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";
const PLAIN: &str = "text/plain; charset=utf-8";

pub(super) async fn serve(listener: TcpListener, handle: PrometheusHandle, health: Arc<Health>) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // E.g. out of file descriptors: back off rather than spin.
                tracing::warn!(error = %e, "metrics endpoint: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let handle = handle.clone();
        let health = Arc::clone(&health);
        tokio::spawn(async move {
            let _ =
                tokio::time::timeout(CONNECTION_TIMEOUT, answer(stream, &handle, &health)).await;
        });
    }
}

async fn answer(
    mut stream: TcpStream,
    handle: &PrometheusHandle,
    health: &Health,
) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(512);
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_HEAD {
        if stream.read_buf(&mut head).await? == 0 {
            break;
        }
    }
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let reply = route(method, target, handle, health);
    let mut out = format!(
        "HTTP/1.1 {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nCache-Control: no-store\r\n{}Connection: close\r\n\r\n",
        reply.status,
        reply.content_type,
        reply.body.len(),
        if reply.status.starts_with("405") { "Allow: GET, HEAD\r\n" } else { "" },
    )
    .into_bytes();
    if method != "HEAD" {
        out.extend_from_slice(reply.body.as_bytes());
    }
    stream.write_all(&out).await?;
    stream.shutdown().await
}

struct Reply {
    status: &'static str,
    content_type: &'static str,
    body: String,
}

fn route(method: &str, target: &str, handle: &PrometheusHandle, health: &Health) -> Reply {
    let reply = |status, content_type, body: String| Reply {
        status,
        content_type,
        body,
    };
    if method != "GET" && method != "HEAD" {
        return reply("405 Method Not Allowed", PLAIN, "use GET\n".into());
    }
    match target.split('?').next().unwrap_or("") {
        "/metrics" => {
            export::refresh(health);
            reply("200 OK", PROMETHEUS_TEXT, handle.render())
        }
        "/healthz" => reply("200 OK", PLAIN, "ok\n".into()),
        "/readyz" => match health.readiness() {
            Ok(()) => reply("200 OK", PLAIN, "ready\n".into()),
            Err(reason) => reply("503 Service Unavailable", PLAIN, format!("{reason}\n")),
        },
        _ => reply(
            "404 Not Found",
            PLAIN,
            "not found; try /metrics, /healthz or /readyz\n".into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use metrics_exporter_prometheus::PrometheusBuilder;

    #[test]
    fn routes() {
        // A recorder that is not installed globally: render works, nothing
        // else in the test binary is affected.
        let handle = PrometheusBuilder::new().build_recorder().handle();
        let health = Health::new(&Config::default());
        let r = route("GET", "/healthz", &handle, &health);
        assert_eq!((r.status, r.body.as_str()), ("200 OK", "ok\n"));
        let r = route("GET", "/readyz?verbose", &handle, &health);
        assert!(r.status.starts_with("503"), "{}", r.status);
        assert!(r.body.contains("PostgreSQL") && r.body.ends_with('\n'));
        assert_eq!(r.body.lines().count(), 1);
        health.postgres_up();
        health.kafka_up();
        assert_eq!(route("HEAD", "/readyz", &handle, &health).status, "200 OK");
        let r = route("GET", "/metrics", &handle, &health);
        assert_eq!((r.status, r.content_type), ("200 OK", PROMETHEUS_TEXT));
        assert!(route("GET", "/", &handle, &health)
            .status
            .starts_with("404"));
        assert!(route("POST", "/metrics", &handle, &health)
            .status
            .starts_with("405"));
    }
}
