//! Reading a JSON value whose non-finite floats were written as `null`.
//!
//! serde_json writes a NaN or infinite `f64` as `null` and refuses `null` where it reads an
//! `f64`, so a learner record carrying one non-finite figure (the gradient norm of an update
//! the optimizer skipped) would not read back at all. [`NullAsNan`] deserializes a
//! [`serde_json::Value`] as serde_json does, except that `null` where an `f64` or `f32` is
//! expected reads as NaN. The report takes a non-finite figure as absent: charts leave the
//! point out and means skip it.

use serde::de::value::{Error, MapDeserializer, SeqDeserializer};
use serde::de::{self, Error as _, IntoDeserializer, Visitor};
use serde::forward_to_deserialize_any;
use serde_json::Value;

/// A borrowed JSON value to deserialize, with `null` floats read as NaN.
#[derive(Clone, Copy)]
pub struct NullAsNan<'a>(pub &'a Value);

impl<'de> de::Deserializer<'de> for NullAsNan<'de> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.0 {
            Value::Null => visitor.visit_unit(),
            Value::Bool(b) => visitor.visit_bool(*b),
            Value::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
                (Some(u), _, _) => visitor.visit_u64(u),
                (None, Some(i), _) => visitor.visit_i64(i),
                (None, None, Some(f)) => visitor.visit_f64(f),
                (None, None, None) => Err(Error::custom(format!("unreadable number {n}"))),
            },
            Value::String(s) => visitor.visit_borrowed_str(s),
            Value::Array(items) => {
                let mut seq = SeqDeserializer::new(items.iter().map(NullAsNan));
                let out = visitor.visit_seq(&mut seq)?;
                seq.end()?;
                Ok(out)
            }
            Value::Object(entries) => {
                let mut map =
                    MapDeserializer::new(entries.iter().map(|(k, v)| (k.as_str(), NullAsNan(v))));
                let out = visitor.visit_map(&mut map)?;
                map.end()?;
                Ok(out)
            }
        }
    }

    fn deserialize_f64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.0 {
            Value::Null => visitor.visit_f64(f64::NAN),
            _ => self.deserialize_any(visitor),
        }
    }

    fn deserialize_f32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.0 {
            Value::Null => visitor.visit_f32(f32::NAN),
            _ => self.deserialize_any(visitor),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.0 {
            Value::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(self)
    }

    /// Enums are read by serde_json itself (a `null` float inside one is not turned into NaN).
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        de::Deserializer::deserialize_enum(self.0.clone(), name, variants, visitor)
            .map_err(Error::custom)
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 char str string bytes byte_buf unit
        unit_struct seq tuple tuple_struct map struct identifier ignored_any
    }
}

impl<'de> IntoDeserializer<'de, Error> for NullAsNan<'de> {
    type Deserializer = Self;

    fn into_deserializer(self) -> Self {
        self
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;
    use serde_json::json;

    use super::*;

    #[derive(Debug, Deserialize, PartialEq)]
    struct Inner {
        x: f64,
        n: u32,
        tag: Option<String>,
    }

    #[derive(Debug, Deserialize)]
    struct Outer {
        a: f64,
        xs: Vec<f64>,
        inner: Inner,
        by_key: std::collections::BTreeMap<String, i64>,
        maybe: Option<f64>,
    }

    #[test]
    fn null_floats_read_as_nan_and_everything_else_as_serde_json_reads_it() {
        let v = json!({"a": null, "xs": [1.5, null, -2], "inner": {"x": 0.25, "n": 7, "tag": "t"},
                       "by_key": {"k": -3}, "maybe": null, "extra": [true]});
        let o = Outer::deserialize(NullAsNan(&v)).unwrap();
        assert!(o.a.is_nan());
        assert_eq!(o.xs[0], 1.5);
        assert!(o.xs[1].is_nan());
        assert_eq!(o.xs[2], -2.0);
        assert_eq!(
            o.inner,
            Inner {
                x: 0.25,
                n: 7,
                tag: Some("t".into())
            }
        );
        assert_eq!(o.by_key["k"], -3);
        assert_eq!(o.maybe, None, "an optional float that is null is absent");
    }

    #[test]
    fn a_null_where_no_float_is_expected_is_still_an_error() {
        let v = json!({"x": 1.0, "n": null, "tag": null});
        assert!(Inner::deserialize(NullAsNan(&v)).is_err());
        let v = json!({"x": 1.0, "tag": null});
        assert!(Inner::deserialize(NullAsNan(&v)).is_err(), "missing field");
    }
}
