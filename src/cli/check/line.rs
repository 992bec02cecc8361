//! One check's result line and its verdict, shared by every check.

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Verdict {
    Ok,
    /// Not checked because an earlier check failed.
    Skip,
    /// Works, but deserves a look.
    Warn,
    Fail,
}

impl Verdict {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Skip => "skip",
            Verdict::Warn => "warn",
            Verdict::Fail => "FAIL",
        }
    }
}

/// One check's result. `detail` says what was found; for `Fail` and `Warn`
/// it is the message naming the fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Line {
    pub verdict: Verdict,
    pub name: &'static str,
    pub detail: String,
}

impl Line {
    pub(crate) fn new(verdict: Verdict, name: &'static str, detail: impl Into<String>) -> Line {
        Line {
            verdict,
            name,
            detail: detail.into(),
        }
    }
    pub(crate) fn ok(name: &'static str, detail: impl Into<String>) -> Line {
        Line::new(Verdict::Ok, name, detail)
    }
    pub(crate) fn warn(name: &'static str, detail: impl ToString) -> Line {
        Line::new(Verdict::Warn, name, detail.to_string())
    }
    pub(crate) fn fail(name: &'static str, detail: impl ToString) -> Line {
        Line::new(Verdict::Fail, name, detail.to_string())
    }
    pub(crate) fn skip(name: &'static str, why: &str) -> Line {
        Line::new(Verdict::Skip, name, format!("not checked: {why}"))
    }

    /// Several findings about one check: the worst verdict, and the findings
    /// of that verdict (what is fine is not worth reading next to a failure).
    pub(crate) fn worst(
        name: &'static str,
        findings: Vec<(Verdict, String)>,
        fine: String,
    ) -> Line {
        let Some(worst) = findings.iter().map(|(v, _)| *v).max() else {
            return Line::ok(name, fine);
        };
        let detail: Vec<String> = findings
            .into_iter()
            .filter(|(v, _)| *v == worst)
            .map(|(_, d)| d)
            .collect();
        Line::new(worst, name, detail.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worst_finding_decides() {
        let l = Line::worst("x", vec![], "all fine".into());
        assert_eq!((l.verdict, l.detail.as_str()), (Verdict::Ok, "all fine"));
        let l = Line::worst(
            "x",
            vec![
                (Verdict::Warn, "w".into()),
                (Verdict::Fail, "f1".into()),
                (Verdict::Fail, "f2".into()),
            ],
            "fine".into(),
        );
        assert_eq!((l.verdict, l.detail.as_str()), (Verdict::Fail, "f1; f2"));
    }
}
