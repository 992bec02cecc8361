//! Configuration errors never quote a secret: TOML syntax errors on lines
//! holding a password, literal or substituted from the environment.

use crate::config::redact::MASK;
use crate::config::Config;

fn error(text: &str, env: &[(&str, &str)]) -> String {
    Config::from_toml_str_with_env(text, |name| {
        env.iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.to_string())
    })
    .unwrap_err()
    .to_string()
}

#[test]
fn url_userinfo_password_is_masked_and_the_error_still_points_at_the_line() {
    // Unterminated string: toml quotes the whole line.
    let e = error(
        "[postgres]\nurl = \"postgresql://app:hunter2@db:5432/app\nslot = \"s\"\n",
        &[],
    );
    assert!(!e.contains("hunter2"), "{e}");
    assert!(e.contains("line 2"), "{e}");
    assert!(
        e.contains(&format!("url = \"postgresql://app:{MASK}@db:5432/app")),
        "{e}"
    );
}

#[test]
fn password_holding_a_quote_or_an_at_sign_is_masked_whole() {
    let e = error(
        "[postgres]\nurl = \"postgresql://app:hu\"nt@er2@db/app\"\n",
        &[],
    );
    for part in ["hu", "nt@er2"] {
        assert!(!e.contains(part), "{part} in {e}");
    }
    assert!(e.contains("@db/app"), "{e}");
}

#[test]
fn password_query_parameter_is_masked() {
    let e = error(
        "[postgres]\nurl = \"postgresql://app@db/app?sslmode=require&password=s3cr3t&x=1\n",
        &[],
    );
    assert!(!e.contains("s3cr3t"), "{e}");
    assert!(e.contains("sslmode=require"), "{e}");
}

#[test]
fn value_substituted_from_the_environment_into_the_url_is_masked() {
    for value in [
        "postgresql://app:fromenv@db/app",
        "postgresql://app@db/app?password=fromenv",
    ] {
        let e = error(
            "[postgres]\nurl = \"${OUTBOXD_PG_URL}\nslot = \"s\"\n",
            &[("OUTBOXD_PG_URL", value)],
        );
        assert!(!e.contains("fromenv"), "{e}");
        assert!(
            !e.contains("db/app"),
            "the substituted URL is masked whole: {e}"
        );
        assert!(e.contains(&format!("url = \"{MASK}")), "{e}");
    }
    // Only the password substituted.
    let e = error(
        "[postgres]\nurl = \"postgresql://app:${PW}@db/app\n",
        &[("PW", "x9$z")],
    );
    assert!(!e.contains("x9$z"), "{e}");
    assert!(e.contains("@db/app"), "{e}");
}

#[test]
fn secret_keys_are_masked_whatever_their_value() {
    for line in [
        "sasl.password = \"pa55",
        "\"sasl.password\" = 'pa55",
        "\"ssl.key.password\" = pa55",
        "sasl.oauthbearer.client.secret = \"pa55",
    ] {
        let e = error(&format!("[kafka.properties]\n{line}\n"), &[]);
        assert!(!e.contains("pa55"), "{line}: {e}");
    }
    let e = error(
        "[kafka.properties]\n\"sasl.password\" = \"${KAFKA_PW}\n",
        &[("KAFKA_PW", "envpw")],
    );
    assert!(!e.contains("envpw"), "{e}");
}

#[test]
fn substituted_values_elsewhere_and_password_sources_stay_readable() {
    let e = error(
        "[postgres]\nurl = \"postgresql://app@db/app\"\npassword_env = \"PGPW\"\n\
         slot = \"${SLOT}\" x\n",
        &[("SLOT", "myslot")],
    );
    assert!(e.contains("myslot"), "{e}");
    assert!(e.contains("line 4"), "{e}");
    let e = error("[postgres]\npassword_file = \"/run/pw\" x\n", &[]);
    assert!(e.contains("/run/pw"), "{e}");
}

#[test]
fn caret_points_at_the_error_on_the_masked_line() {
    // The caret sits under the stray character after the masked URL.
    let e = error(
        "[postgres]\nurl = \"postgresql://app:hunter2@db/app\" x\n",
        &[],
    );
    let lines: Vec<&str> = e.lines().collect();
    let quoted = lines.iter().position(|l| l.starts_with("2 | ")).unwrap();
    let caret = lines[quoted + 1].find('^').unwrap();
    assert_eq!(&lines[quoted][caret..caret + 1], "x", "{e}");
}

#[test]
fn client_key_password_parameter_is_masked_and_file_paths_are_kept() {
    // outboxd refuses sslpassword, but a line holding one must not quote it.
    let e = error(
        "[postgres]\nurl = \"postgresql://app@db/app?sslcert=/etc/c.crt&sslkey=/etc/c.key&sslpassword=k3ypass&channel_binding=require\n",
        &[],
    );
    assert!(!e.contains("k3ypass"), "{e}");
    assert!(e.contains("sslkey=/etc/c.key"), "{e}");
}
