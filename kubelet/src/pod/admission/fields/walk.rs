//! Walks the `v1.Pod` schema as k8s-openapi defines it. Each generated type deserializes itself
//! through `deserialize_struct(type name, field names, ..)`; a deserializer that answers every
//! request with one sample value sees every type and every field name reachable from `Pod`,
//! exactly as they appear on the wire. A field added in a future k8s-openapi release shows up
//! here without anyone listing it.

use serde::de::{self, DeserializeSeed, IntoDeserializer, MapAccess, SeqAccess, Visitor};
use std::cell::RefCell;
use std::collections::BTreeSet;

/// One field of one schema type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaField {
    /// The type that holds the field (`VolumeMount`).
    pub owner: &'static str,
    /// The field's name on the wire (`mountPropagation`).
    pub name: &'static str,
    /// The first path at which the walk met it (`spec.containers[].volumeMounts[].mountPropagation`).
    pub path: String,
    /// The field's own type when it is an object type (`Probe`), else None.
    pub child: Option<&'static str>,
}

#[derive(Debug)]
pub struct WalkError(String);

impl std::fmt::Display for WalkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for WalkError {}
impl de::Error for WalkError {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        WalkError(msg.to_string())
    }
}

#[derive(Default)]
struct Seen {
    fields: Vec<SchemaField>,
    /// (owner, name) already recorded, and the types whose fields were walked.
    pairs: BTreeSet<(&'static str, &'static str)>,
    types: BTreeSet<&'static str>,
}

/// Every field of every object type reachable from `T`, each type once, in walk order.
pub fn schema_fields<T: serde::de::DeserializeOwned>() -> Result<Vec<SchemaField>, WalkError> {
    let seen = RefCell::new(Seen::default());
    T::deserialize(Tracer {
        seen: &seen,
        path: String::new(),
        parent: None,
        leaf: Leaf::Sample,
        depth: 0,
    })?;
    Ok(seen.into_inner().fields)
}

/// What a string leaf answers: apiVersion and kind of the top object must match the type.
#[derive(Clone, Copy)]
enum Leaf {
    Sample,
    Fixed(&'static str),
}

struct Tracer<'a> {
    seen: &'a RefCell<Seen>,
    path: String,
    /// The index in `seen.fields` of the field this value belongs to.
    parent: Option<usize>,
    leaf: Leaf,
    depth: usize,
}

impl<'a> Tracer<'a> {
    fn child(&self, path: String, parent: Option<usize>, leaf: Leaf) -> Self {
        Tracer {
            seen: self.seen,
            path,
            parent,
            leaf,
            depth: self.depth + 1,
        }
    }
    fn sample_str(&self) -> &'static str {
        match self.leaf {
            Leaf::Fixed(s) => s,
            Leaf::Sample => "1",
        }
    }
}

const TOP_API_FIELDS: [(&str, &str); 2] = [("apiVersion", "v1"), ("kind", "Pod")];
const MAX_DEPTH: usize = 64;

struct Fields<'a> {
    tracer: Tracer<'a>,
    owner: &'static str,
    names: std::slice::Iter<'static, &'static str>,
    /// Whether this object's fields were walked before (a type met again: values only).
    walked: bool,
    current: Option<&'static str>,
}

impl<'de, 'a> MapAccess<'de> for Fields<'a> {
    type Error = WalkError;
    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, WalkError> {
        let Some(&name) = self.names.next() else {
            return Ok(None);
        };
        self.current = Some(name);
        seed.deserialize(name.into_deserializer()).map(Some)
    }
    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, WalkError> {
        let name = self.current.take().unwrap_or_default();
        let path = if self.tracer.path.is_empty() {
            name.to_string()
        } else {
            format!("{}.{name}", self.tracer.path)
        };
        let leaf = match TOP_API_FIELDS.iter().find(|(f, _)| *f == name) {
            Some((_, v)) if self.tracer.depth == 0 => Leaf::Fixed(v),
            _ => Leaf::Sample,
        };
        let index = {
            let mut seen = self.tracer.seen.borrow_mut();
            if !self.walked && seen.pairs.insert((self.owner, name)) {
                seen.fields.push(SchemaField {
                    owner: self.owner,
                    name,
                    path: path.clone(),
                    child: None,
                });
                Some(seen.fields.len() - 1)
            } else {
                None
            }
        };
        seed.deserialize(self.tracer.child(path, index, leaf))
    }
}

struct One<'a> {
    tracer: Option<Tracer<'a>>,
}

impl<'de, 'a> SeqAccess<'de> for One<'a> {
    type Error = WalkError;
    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, WalkError> {
        self.tracer.take().map(|t| seed.deserialize(t)).transpose()
    }
}

/// A map with one entry: key "k", the value traced.
struct OneEntry<'a> {
    tracer: Option<Tracer<'a>>,
    key_done: bool,
}

impl<'de, 'a> MapAccess<'de> for OneEntry<'a> {
    type Error = WalkError;
    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, WalkError> {
        if self.key_done || self.tracer.is_none() {
            return Ok(None);
        }
        self.key_done = true;
        seed.deserialize("k".into_deserializer()).map(Some)
    }
    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, WalkError> {
        let t = self
            .tracer
            .take()
            .ok_or_else(|| WalkError("value without key".into()))?;
        seed.deserialize(t)
    }
}

macro_rules! leaf {
    ($($method:ident => $visit:ident($($value:expr)?);)*) => {
        $(fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, WalkError> {
            visitor.$visit($($value)?)
        })*
    };
}

impl<'de, 'a> de::Deserializer<'de> for Tracer<'a> {
    type Error = WalkError;

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, WalkError> {
        if self.depth > MAX_DEPTH {
            return Err(WalkError(format!(
                "schema deeper than {MAX_DEPTH} at {}",
                self.path
            )));
        }
        let walked = {
            let mut seen = self.seen.borrow_mut();
            if let Some(i) = self.parent {
                seen.fields[i].child = Some(name);
            }
            !seen.types.insert(name)
        };
        // A type met again is walked again (its required fields must be there) but its fields
        // are recorded once; the depth bound ends recursive types.
        visitor.visit_map(Fields {
            tracer: self,
            owner: name,
            names: fields.iter(),
            walked,
            current: None,
        })
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, WalkError> {
        visitor.visit_some(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, WalkError> {
        let path = format!("{}[]", self.path);
        let t = self.child(path, self.parent, self.leaf);
        visitor.visit_seq(One { tracer: Some(t) })
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, WalkError> {
        let path = format!("{}{{}}", self.path);
        let t = self.child(path, self.parent, Leaf::Sample);
        visitor.visit_map(OneEntry {
            tracer: Some(t),
            key_done: false,
        })
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, WalkError> {
        match name {
            "Time" | "MicroTime" => visitor
                .visit_newtype_struct("2026-01-01T00:00:00Z".into_deserializer()
                    as de::value::StrDeserializer<'_, WalkError>),
            _ => visitor.visit_newtype_struct(self),
        }
    }

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, WalkError> {
        visitor.visit_str(self.sample_str())
    }
    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, WalkError> {
        visitor.visit_str(self.sample_str())
    }
    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, WalkError> {
        visitor.visit_str(self.sample_str())
    }
    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, WalkError> {
        visitor.visit_str(self.sample_str())
    }

    leaf! {
        deserialize_bool => visit_bool(true);
        deserialize_i8 => visit_i8(1);
        deserialize_i16 => visit_i16(1);
        deserialize_i32 => visit_i32(1);
        deserialize_i64 => visit_i64(1);
        deserialize_u8 => visit_u8(1);
        deserialize_u16 => visit_u16(1);
        deserialize_u32 => visit_u32(1);
        deserialize_u64 => visit_u64(1);
        deserialize_f32 => visit_f32(1.0);
        deserialize_f64 => visit_f64(1.0);
        deserialize_char => visit_char('1');
        deserialize_unit => visit_unit();
        deserialize_ignored_any => visit_unit();
    }

    fn deserialize_bytes<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, WalkError> {
        visitor.visit_bytes(b"1")
    }
    fn deserialize_byte_buf<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, WalkError> {
        visitor.visit_bytes(b"1")
    }
    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, WalkError> {
        visitor.visit_unit()
    }
    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, WalkError> {
        self.deserialize_seq(visitor)
    }
    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, WalkError> {
        self.deserialize_seq(visitor)
    }
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        _variants: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, WalkError> {
        Err(WalkError(format!(
            "enum {name} at {}: not a k8s-openapi shape",
            self.path
        )))
    }
}
