//! An Avro schema compiled once into what the encoder needs per event:
//! named types resolved to node indices, each record's fields in order with
//! their defaults already encoded, and the names and lists that errors show
//! already written out. Walking apache-avro's `Schema` per event would
//! resolve each reference by its full name (a `String` built per lookup) and
//! re-read each default from its JSON.

use std::collections::HashMap;

use apache_avro::schema::{Name, Namespace, Schema};

use super::encode::{self, Origin};

/// Where a node is in [`Plan::nodes`].
pub(super) type NodeId = usize;

/// What one schema (or one part of it) accepts, and how it is written.
#[derive(Debug)]
pub(super) enum Node {
    Null,
    Boolean,
    Int,
    Long,
    Float,
    Double,
    String,
    Bytes,
    /// `expected` is what an error says the schema expects.
    Fixed {
        size: usize,
        expected: String,
    },
    Enum {
        symbols: Vec<String>,
        /// `enum <name>`.
        label: String,
    },
    Array(NodeId),
    Map(NodeId),
    Record(Record),
    Union(Union),
    Decimal {
        precision: usize,
        scale: usize,
        /// The `fixed` it is stored in: its size and `fixed <name>`.
        fixed: Option<(usize, String)>,
    },
    Uuid,
    Date,
    TimeMillis,
    TimeMicros,
    /// `timestamp-*` and `local-timestamp-*` (millis and micros): ISO 8601
    /// or a count; `per_unit` is microseconds per unit.
    Timestamp {
        local: bool,
        per_unit: i64,
        expected: &'static str,
    },
    /// `timestamp-nanos` and `local-timestamp-nanos`: a count only.
    Nanos {
        expected: &'static str,
    },
    /// `duration`, `big-decimal`: not mapped from JSON.
    Unsupported,
    /// A reference to a name the schema does not define (full name).
    Unknown(String),
}

#[derive(Debug)]
pub(super) struct Record {
    /// The record's name as errors show it.
    pub name: String,
    pub fields: Vec<Field>,
    /// `record <name> with the fields a, b`: for a member it has no field for.
    pub with_fields: String,
}

#[derive(Debug)]
pub(super) struct Field {
    pub name: String,
    pub aliases: Vec<String>,
    pub node: NodeId,
    pub default: Option<Default>,
}

/// A field's default: its JSON text, and its Avro binary when it encodes
/// (when it does not, the encoder reads the text again to name where it
/// fails, on the rare payload that needs it).
#[derive(Debug)]
pub(super) struct Default {
    pub text: String,
    pub encoded: Option<Vec<u8>>,
}

#[derive(Debug)]
pub(super) struct Union {
    pub branches: Vec<NodeId>,
    /// The `null` branch's index.
    pub null: Option<usize>,
    /// The indices of the other branches, in the schema's order.
    pub candidates: Vec<usize>,
    /// `one of the union's branches [null, int]`.
    pub expected: String,
}

/// The compiled schema; `nodes[0]` is the root.
#[derive(Debug)]
pub(super) struct Plan {
    pub nodes: Vec<Node>,
}

impl Plan {
    /// Compiles `root`; `names` holds its named types by full name.
    pub(super) fn compile(root: &Schema, names: &HashMap<Name, Schema>) -> Plan {
        let mut c = Compiler {
            names,
            nodes: Vec::new(),
            by_name: HashMap::new(),
        };
        c.node(root, &None);
        let mut plan = Plan { nodes: c.nodes };
        plan.encode_defaults();
        plan
    }

    /// Encodes every field default once (a second pass: a default may be of
    /// a type whose own fields' defaults are not encoded yet, which the
    /// encoder then reads from their text).
    fn encode_defaults(&mut self) {
        let mut found = Vec::new();
        for (n, node) in self.nodes.iter().enumerate() {
            if let Node::Record(r) = node {
                for (f, field) in r.fields.iter().enumerate() {
                    if let Some(d) = &field.default {
                        let mut out = Vec::new();
                        if encode::encode_text(self, field.node, &d.text, Origin::Default, &mut out)
                            .is_ok()
                        {
                            found.push((n, f, out));
                        }
                    }
                }
            }
        }
        for (n, f, out) in found {
            if let Node::Record(r) = &mut self.nodes[n] {
                if let Some(d) = &mut r.fields[f].default {
                    d.encoded = Some(out);
                }
            }
        }
    }
}

struct Compiler<'s> {
    names: &'s HashMap<Name, Schema>,
    nodes: Vec<Node>,
    by_name: HashMap<Name, NodeId>,
}

impl Compiler<'_> {
    /// The node of `schema` (`ns`: the enclosing namespace), added with
    /// those under it.
    fn node(&mut self, schema: &Schema, ns: &Namespace) -> NodeId {
        let id = self.nodes.len();
        self.nodes.push(Node::Null);
        let node = match schema {
            Schema::Ref { name } => {
                self.nodes.pop();
                return self.reference(name, ns);
            }
            Schema::Null => Node::Null,
            Schema::Boolean => Node::Boolean,
            Schema::Int => Node::Int,
            Schema::Long => Node::Long,
            Schema::Float => Node::Float,
            Schema::Double => Node::Double,
            Schema::String => Node::String,
            Schema::Bytes => Node::Bytes,
            Schema::Fixed(f) => {
                self.by_name.insert(f.name.fully_qualified_name(ns), id);
                Node::Fixed {
                    size: f.size,
                    expected: format!("fixed {} of {} bytes (a base64 string)", f.name, f.size),
                }
            }
            Schema::Enum(e) => {
                self.by_name.insert(e.name.fully_qualified_name(ns), id);
                Node::Enum {
                    symbols: e.symbols.clone(),
                    label: format!("enum {}", e.name),
                }
            }
            Schema::Array(a) => Node::Array(self.node(&a.items, ns)),
            Schema::Map(m) => Node::Map(self.node(&m.types, ns)),
            Schema::Record(r) => {
                let full = r.name.fully_qualified_name(ns);
                let inner = full.namespace.clone();
                // Before the fields: a field may refer to the record itself.
                self.by_name.insert(full, id);
                let fields = r
                    .fields
                    .iter()
                    .map(|f| Field {
                        name: f.name.clone(),
                        aliases: f.aliases.clone().unwrap_or_default(),
                        node: self.node(&f.schema, &inner),
                        default: f.default.as_ref().map(|d| Default {
                            text: d.to_string(),
                            encoded: None,
                        }),
                    })
                    .collect::<Vec<_>>();
                let list: Vec<&str> = fields.iter().map(|f| f.name.as_str()).collect();
                Node::Record(Record {
                    name: r.name.to_string(),
                    with_fields: format!("record {} with the fields {}", r.name, list.join(", ")),
                    fields,
                })
            }
            Schema::Union(u) => {
                let variants = u.variants();
                let null = variants.iter().position(|b| *b == Schema::Null);
                let candidates = (0..variants.len())
                    .filter(|&i| variants[i] != Schema::Null)
                    .collect();
                let names: Vec<String> = variants.iter().map(branch_name).collect();
                Node::Union(Union {
                    branches: variants.iter().map(|b| self.node(b, ns)).collect(),
                    null,
                    candidates,
                    expected: format!("one of the union's branches [{}]", names.join(", ")),
                })
            }
            Schema::Decimal(d) => Node::Decimal {
                precision: d.precision,
                scale: d.scale,
                fixed: match d.inner.as_ref() {
                    Schema::Fixed(f) => Some((f.size, format!("fixed {}", f.name))),
                    _ => None,
                },
            },
            Schema::Uuid => Node::Uuid,
            Schema::Date => Node::Date,
            Schema::TimeMillis => Node::TimeMillis,
            Schema::TimeMicros => Node::TimeMicros,
            Schema::TimestampMillis => Node::Timestamp {
                local: false,
                per_unit: 1000,
                expected: "a timestamp-millis (ISO 8601 or epoch milliseconds)",
            },
            Schema::TimestampMicros => Node::Timestamp {
                local: false,
                per_unit: 1,
                expected: "a timestamp-micros (ISO 8601 or epoch microseconds)",
            },
            Schema::LocalTimestampMillis => Node::Timestamp {
                local: true,
                per_unit: 1000,
                expected: "a local-timestamp-millis (ISO 8601 without a zone, or milliseconds)",
            },
            Schema::LocalTimestampMicros => Node::Timestamp {
                local: true,
                per_unit: 1,
                expected: "a local-timestamp-micros (ISO 8601 without a zone, or microseconds)",
            },
            Schema::TimestampNanos => Node::Nanos {
                expected: "a timestamp-nanos (epoch nanoseconds)",
            },
            Schema::LocalTimestampNanos => Node::Nanos {
                expected: "a local-timestamp-nanos (nanoseconds)",
            },
            Schema::Duration | Schema::BigDecimal => Node::Unsupported,
        };
        self.nodes[id] = node;
        id
    }

    /// A named type used by name: the node compiled where it was defined.
    fn reference(&mut self, name: &Name, ns: &Namespace) -> NodeId {
        let full = name.fully_qualified_name(ns);
        if let Some(&id) = self.by_name.get(&full) {
            return id;
        }
        let names = self.names;
        match names.get(&full) {
            // Defined somewhere not walked yet.
            Some(target) => self.node(target, &full.namespace),
            None => {
                let id = self.nodes.len();
                self.nodes.push(Node::Unknown(full.to_string()));
                id
            }
        }
    }
}

fn branch_name(s: &Schema) -> String {
    match s {
        Schema::Record(r) => r.name.to_string(),
        Schema::Enum(e) => e.name.to_string(),
        Schema::Fixed(f) => f.name.to_string(),
        Schema::Ref { name } => name.to_string(),
        Schema::Array(_) => "array".into(),
        Schema::Map(_) => "map".into(),
        other => format!("{:?}", apache_avro::schema::SchemaKind::from(other)).to_lowercase(),
    }
}
