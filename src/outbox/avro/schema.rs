//! A parsed Avro schema, and the encoding of a payload with it.

use std::collections::HashMap;

use apache_avro::schema::{Name, Namespace, Schema};

use super::error::EncodeError;
use super::plan::Plan;
use super::{encode, json};

/// A parsed Avro schema, compiled for encoding (see `plan`).
#[derive(Debug)]
pub(crate) struct AvroSchema {
    /// The schema as apache-avro parsed it: only the tests decode with it;
    /// encoding needs the plan alone, so a running relay does not keep it.
    #[cfg(test)]
    pub(super) root: Schema,
    plan: Plan,
}

impl AvroSchema {
    /// Parses an Avro schema's JSON text (as the registry serves it).
    pub(crate) fn parse(text: &str) -> Result<AvroSchema, String> {
        let root = Schema::parse_str(text).map_err(|e| e.to_string())?;
        let mut names = HashMap::new();
        collect_names(&root, &None, &mut names);
        let plan = Plan::compile(&root, &names);
        Ok(AvroSchema {
            #[cfg(test)]
            root,
            plan,
        })
    }

    /// The Avro binary datum of `payload` (JSON text), by the mapping in
    /// `encode`, appended to `out`. On an error, `out` may hold part of the
    /// datum after what it held before.
    pub(crate) fn encode(&self, payload: &[u8], out: &mut Vec<u8>) -> Result<(), EncodeError> {
        let text = std::str::from_utf8(payload)
            .map_err(|_| EncodeError::NotJson("the payload is not UTF-8 text".into()))?;
        let json = json::parse(text).map_err(EncodeError::NotJson)?;
        encode::encode(&self.plan, &json, out)
    }
}
/// Every named type under `schema`, by full name (a name without a
/// namespace takes the enclosing one, as the Avro specification says).
fn collect_names(schema: &Schema, ns: &Namespace, out: &mut HashMap<Name, Schema>) {
    match schema {
        Schema::Record(r) => {
            let full = r.name.fully_qualified_name(ns);
            let inner = full.namespace.clone();
            out.insert(full, schema.clone());
            for f in &r.fields {
                collect_names(&f.schema, &inner, out);
            }
        }
        Schema::Enum(e) => {
            out.insert(e.name.fully_qualified_name(ns), schema.clone());
        }
        Schema::Fixed(f) => {
            out.insert(f.name.fully_qualified_name(ns), schema.clone());
        }
        Schema::Decimal(d) => collect_names(&d.inner, ns, out),
        Schema::Array(a) => collect_names(&a.items, ns, out),
        Schema::Map(m) => collect_names(&m.types, ns, out),
        Schema::Union(u) => {
            for s in u.variants() {
                collect_names(s, ns, out);
            }
        }
        _ => {}
    }
}
