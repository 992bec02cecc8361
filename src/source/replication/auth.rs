//! The login on the walsender connection: trust, cleartext, MD5 or
//! SCRAM-SHA-256, the latter bound to the TLS session (SCRAM-SHA-256-PLUS)
//! as libpq's `channel_binding` asks.

use postgres_protocol::authentication::md5_hash;
use postgres_protocol::authentication::sasl::{
    ChannelBinding as SaslBinding, ScramSha256, SCRAM_SHA_256, SCRAM_SHA_256_PLUS,
};
use postgres_protocol::message::backend::Message;
use postgres_protocol::message::frontend;
use tokio_postgres::error::SqlState;

use super::error::{ReplicationError, ServerError};
use super::framed::{Frame, FramedConnection};
use crate::config::conn_params::{ChannelBinding, ConnParams};

/// Refusals of the login itself: a wrong password, or pg_hba.conf.
const AUTH_SQLSTATES: [SqlState; 2] = [
    SqlState::INVALID_PASSWORD,
    SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
];

/// What the TLS session offers SCRAM to bind the login to.
pub(super) enum TlsBinding {
    /// No TLS: nothing to bind to.
    Plain,
    /// The `tls-server-end-point` data of the server's certificate.
    EndPoint(Vec<u8>),
    /// TLS, but its certificate gives no binding; why.
    Unavailable(String),
}

pub(super) async fn authenticate(
    framed: &mut FramedConnection,
    params: &ConnParams,
    binding: &TlsBinding,
) -> Result<(), ReplicationError> {
    let auth_err = |reason: String| ReplicationError::Auth {
        user: params.user.clone(),
        server: format!("{}:{}", params.host, params.port),
        reason,
    };
    // Read only when the server asks: trust or cert logins need no file.
    let password = || match params.current_password() {
        Ok(Some(pw)) => Ok(pw),
        Ok(None) => Err(auth_err(
            "the server requires a password and none is configured: put it in postgres.url, \
             or name it with postgres.password_env or postgres.password_file"
                .into(),
        )),
        Err(e) => Err(auth_err(e.to_string())),
    };
    let require = params.channel_binding == ChannelBinding::Require;
    // Refused before any password leaves: a server that cannot bind the
    // login to TLS may be the man in the middle channel binding is for.
    let unbound = |method: &str| {
        auth_err(format!(
            "channel_binding=require in postgres.url, but the server asks for {method}, which is not \
             SCRAM with channel binding: set scram-sha-256 for this user in pg_hba.conf (on a hostssl \
             line), or drop channel_binding=require"
        ))
    };
    let mut scram: Option<ScramSha256> = None;
    let mut bound = false;
    loop {
        let msg = match framed.read_frame().await? {
            Frame::Other(msg) => msg,
            _ => return Err(framed.protocol_err("unexpected copy frame during authentication")),
        };
        match msg {
            Message::AuthenticationOk if require && !bound => {
                return Err(unbound("no password (trust or cert authentication)"));
            }
            Message::AuthenticationOk => return Ok(()),
            Message::AuthenticationCleartextPassword if require => {
                return Err(unbound("a cleartext password"))
            }
            Message::AuthenticationMd5Password(_) if require => {
                return Err(unbound("an MD5 password"))
            }
            Message::AuthenticationCleartextPassword => {
                frontend::password_message(password()?.as_bytes(), &mut framed.write_buf)
                    .map_err(|e| framed.protocol_err(e.to_string()))?;
            }
            Message::AuthenticationMd5Password(body) => {
                let hash = md5_hash(params.user.as_bytes(), password()?.as_bytes(), body.salt());
                frontend::password_message(hash.as_bytes(), &mut framed.write_buf)
                    .map_err(|e| framed.protocol_err(e.to_string()))?;
            }
            Message::AuthenticationSasl(body) => {
                let (mut offers_scram, mut offers_plus) = (false, false);
                let mut mechanisms = body.mechanisms();
                while let Ok(Some(m)) = fallible_iterator::FallibleIterator::next(&mut mechanisms) {
                    offers_scram |= m == SCRAM_SHA_256;
                    offers_plus |= m == SCRAM_SHA_256_PLUS;
                }
                let (mechanism, channel) = choose_scram(params.channel_binding, binding, offers_scram, offers_plus)
                    .map_err(auth_err)?;
                let s = ScramSha256::new(password()?.as_bytes(), channel);
                frontend::sasl_initial_response(mechanism, s.message(), &mut framed.write_buf)
                    .map_err(|e| framed.protocol_err(e.to_string()))?;
                bound = mechanism == SCRAM_SHA_256_PLUS;
                scram = Some(s);
            }
            Message::AuthenticationSaslContinue(body) => {
                let s = scram.as_mut().ok_or_else(|| framed.protocol_err("SASL continue without start"))?;
                s.update(body.data()).map_err(|e| auth_err(format!("SCRAM exchange failed: {e}")))?;
                frontend::sasl_response(s.message(), &mut framed.write_buf)
                    .map_err(|e| framed.protocol_err(e.to_string()))?;
            }
            Message::AuthenticationSaslFinal(body) => {
                let mut s = scram.take().ok_or_else(|| framed.protocol_err("SASL final without start"))?;
                s.finish(body.data())
                    .map_err(|e| auth_err(format!("the server's SCRAM signature is invalid: {e}")))?;
                continue;
            }
            Message::ErrorResponse(body) => {
                let error = ServerError::from_body(&body);
                return Err(if AUTH_SQLSTATES.contains(&error.sqlstate()) {
                    auth_err(error.to_string())
                } else {
                    framed.server_err(error)
                });
            }
            Message::NoticeResponse(_) => continue,
            _ => return Err(auth_err("the server asked for an authentication method outboxd does not support (use scram-sha-256, md5, password, cert or trust)".into())),
        }
        framed.flush().await?;
    }
}

/// The SCRAM mechanism and channel-binding flag for the server's offer, as
/// libpq chooses them; or why `channel_binding=require` cannot be met.
fn choose_scram(
    wanted: ChannelBinding,
    binding: &TlsBinding,
    offers_scram: bool,
    offers_plus: bool,
) -> Result<(&'static str, SaslBinding), String> {
    let require = wanted == ChannelBinding::Require;
    match binding {
        TlsBinding::EndPoint(hash) if offers_plus && wanted != ChannelBinding::Disable => {
            return Ok((SCRAM_SHA_256_PLUS, SaslBinding::tls_server_end_point(hash.clone())))
        }
        TlsBinding::EndPoint(_) if require => {
            return Err("channel_binding=require in postgres.url, but the server does not offer \
                        SCRAM-SHA-256-PLUS (PostgreSQL 11 or newer with SSL offers it on TLS connections)"
                .into())
        }
        TlsBinding::Plain if require => {
            return Err("channel_binding=require in postgres.url, but the connection is not encrypted \
                        (the server refused TLS): enable ssl on the server and use sslmode=verify-full"
                .into())
        }
        TlsBinding::Unavailable(why) if require => {
            return Err(format!(
                "channel_binding=require in postgres.url cannot be met on the replication connection: {why}"
            ))
        }
        _ => {}
    }
    if !offers_scram {
        return Err("the server offers no SASL mechanism outboxd supports (SCRAM-SHA-256)".into());
    }
    // 'y' (client could bind, server did not offer) lets a server that does
    // support binding detect that the offer was stripped on the way; 'n'
    // when this side cannot or must not bind.
    let flag = match binding {
        TlsBinding::EndPoint(_) if wanted != ChannelBinding::Disable => SaslBinding::unrequested(),
        _ => SaslBinding::unsupported(),
    };
    Ok((SCRAM_SHA_256, flag))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scram_choice_follows_channel_binding() {
        use ChannelBinding::{Disable, Prefer, Require};
        let tls = TlsBinding::EndPoint(vec![7; 32]);
        let plain = TlsBinding::Plain;
        let odd = TlsBinding::Unavailable("signed with Ed25519".into());
        let mech = |w, b: &TlsBinding, plus| choose_scram(w, b, true, plus).map(|(m, _)| m);
        assert_eq!(mech(Prefer, &tls, true), Ok(SCRAM_SHA_256_PLUS));
        assert_eq!(mech(Require, &tls, true), Ok(SCRAM_SHA_256_PLUS));
        assert_eq!(mech(Disable, &tls, true), Ok(SCRAM_SHA_256));
        assert_eq!(mech(Prefer, &tls, false), Ok(SCRAM_SHA_256));
        assert_eq!(mech(Prefer, &plain, false), Ok(SCRAM_SHA_256));
        assert_eq!(mech(Prefer, &odd, true), Ok(SCRAM_SHA_256));
        for (b, plus, needle) in [
            (&tls, false, "SCRAM-SHA-256-PLUS"),
            (&plain, false, "not encrypted"),
            (&odd, true, "Ed25519"),
        ] {
            let err = mech(Require, b, plus).expect_err("refused");
            assert!(
                err.contains("channel_binding=require") && err.contains(needle),
                "{err}"
            );
        }
        let err = choose_scram(Prefer, &plain, false, false)
            .err()
            .expect("refused");
        assert!(err.contains("SCRAM-SHA-256"), "{err}");
    }
}
