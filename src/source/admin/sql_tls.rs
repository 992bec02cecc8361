//! TLS for the tokio-postgres SQL connection, on the same rustls config as
//! the walsender connection, giving tokio-postgres the certificate hash that
//! SCRAM-SHA-256-PLUS binds to (`channel_binding` in `postgres.url`).
//!
//! Our own connector rather than tokio-postgres-rustls 0.13: that crate
//! reads the certificate as a bare TBSCertificate, which fails for every
//! real certificate, so it never offered a binding and
//! `channel_binding=require` could not log in.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::pki_types::ServerName;
use rustls::ClientConfig;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};

use crate::source::replication::channel_binding::server_end_point;
use crate::source::replication::tls::{server_name, TlsConfigError};

/// Makes a [`RustlsConnect`] per host tokio-postgres connects to.
#[derive(Clone)]
pub(crate) struct MakeRustlsConnect(Arc<ClientConfig>);

impl MakeRustlsConnect {
    pub(crate) fn new(config: Arc<ClientConfig>) -> Self {
        MakeRustlsConnect(config)
    }
}

impl<S> MakeTlsConnect<S> for MakeRustlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = BoundTlsStream<S>;
    type TlsConnect = RustlsConnect;
    type Error = TlsConfigError;

    fn make_tls_connect(&mut self, domain: &str) -> Result<RustlsConnect, TlsConfigError> {
        Ok(RustlsConnect {
            config: Arc::clone(&self.0),
            name: server_name(domain)?,
        })
    }
}

/// One TLS handshake with one server.
pub(crate) struct RustlsConnect {
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
}

impl<S> TlsConnect<S> for RustlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = BoundTlsStream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<BoundTlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let tls = tokio_rustls::TlsConnector::from(self.config)
                .connect(self.name, stream)
                .await?;
            // A certificate that gives no binding (Ed25519, RSA-PSS) offers
            // none: `prefer` then logs in unbound, `require` is refused.
            let binding = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|certs| certs.first())
                .and_then(|cert| server_end_point(cert).ok());
            Ok(BoundTlsStream { tls, binding })
        })
    }
}

/// The TLS stream and the `tls-server-end-point` data of its server.
pub(crate) struct BoundTlsStream<S> {
    tls: tokio_rustls::client::TlsStream<S>,
    binding: Option<Vec<u8>>,
}

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for BoundTlsStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        match &self.binding {
            Some(hash) => ChannelBinding::tls_server_end_point(hash.clone()),
            None => ChannelBinding::none(),
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for BoundTlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tls).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for BoundTlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tls).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tls).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tls).poll_shutdown(cx)
    }
}
