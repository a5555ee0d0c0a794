//! [`Timestamp`]: a moment as every longhaul record stores it.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, SubsecRound, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A moment in UTC at millisecond precision, stored as RFC 3339 (`2026-11-24T18:01:56.123Z`)
/// so that lexical order equals time order (index sort keys compare timestamps as strings).
/// A stored text that does not parse is an error where it is read, never "now".
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(DateTime<Utc>);

/// A text that is not an RFC 3339 timestamp, or names a moment outside [`YEARS`] in UTC.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not an RFC 3339 timestamp between the years 0000 and 9999 (UTC): {text:?}")]
pub struct InvalidTimestamp {
    /// The text (at most 64 characters of it).
    pub text: String,
}

impl Timestamp {
    /// Now, truncated to the stored precision (so that it equals itself read back).
    pub fn now() -> Self {
        Timestamp::from(Utc::now())
    }

    /// The moment as a `chrono` time.
    pub fn as_datetime(self) -> DateTime<Utc> {
        self.0
    }

    /// The stored form.
    pub fn to_rfc3339(self) -> String {
        crate::format_rfc3339(self.0)
    }

    /// How long after `earlier` this is (zero if it is not after it).
    pub fn since(self, earlier: Timestamp) -> std::time::Duration {
        (self.0 - earlier.0).to_std().unwrap_or_default()
    }
}

impl From<DateTime<Utc>> for Timestamp {
    fn from(at: DateTime<Utc>) -> Self {
        Timestamp(at.trunc_subsecs(3))
    }
}

/// The years a stored timestamp can name: its four-digit year field. An RFC 3339 text whose
/// offset carries it past either end in UTC (`0000-01-01T00:30:00+01:00`) would be stored with a
/// signed year that no read accepts, and would break lexical order: it is refused instead.
pub const YEARS: std::ops::RangeInclusive<i32> = 0..=9999;

impl FromStr for Timestamp {
    type Err = InvalidTimestamp;

    /// Any RFC 3339 time (any offset) whose UTC year is in [`YEARS`], as UTC at millisecond
    /// precision.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let invalid = || InvalidTimestamp { text: text.chars().take(64).collect() };
        let at = DateTime::parse_from_rfc3339(text).map_err(|_| invalid())?.to_utc();
        if !YEARS.contains(&chrono::Datelike::year(&at)) {
            return Err(invalid());
        }
        Ok(Timestamp::from(at))
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_rfc3339())
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_rfc3339())
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn stored_form_round_trips_and_bad_text_is_an_error() {
        let at: Timestamp = "2026-11-24T18:01:56.123Z".parse().unwrap();
        assert_eq!(at.to_string(), "2026-11-24T18:01:56.123Z");
        let json = serde_json::to_string(&at).unwrap();
        assert_eq!(json, "\"2026-11-24T18:01:56.123Z\"");
        assert_eq!(serde_json::from_str::<Timestamp>(&json).unwrap(), at);
        let offset: Timestamp = "2026-11-24T19:01:56.123456+01:00".parse().unwrap();
        assert_eq!(offset, at);
        for bad in ["", "now", "2026-13-01T00:00:00Z", "1732471316"] {
            assert!(bad.parse::<Timestamp>().is_err(), "{bad:?}");
            assert!(serde_json::from_str::<Timestamp>(&format!("{bad:?}")).is_err(), "{bad:?}");
        }
        let now = Timestamp::now();
        assert_eq!(now.to_string().parse::<Timestamp>().unwrap(), now);
    }

    #[test]
    fn an_offset_that_moves_the_year_out_of_four_digits_is_refused() {
        // Each is valid RFC 3339, but in UTC it is year -1 or 10000: stored, it would read
        // back as no timestamp at all.
        for text in ["0000-01-01T00:30:00+01:00", "9999-12-31T23:59:59-01:00"] {
            assert!(text.parse::<Timestamp>().is_err(), "{text}");
            assert!(serde_json::from_str::<Timestamp>(&format!("{text:?}")).is_err(), "{text}");
        }
        // The ends themselves round-trip.
        for text in ["0000-01-01T00:00:00.000Z", "9999-12-31T23:59:59.999Z"] {
            let at: Timestamp = text.parse().unwrap();
            assert_eq!(at.to_string(), text);
            assert_eq!(at.to_string().parse::<Timestamp>().unwrap(), at);
        }
    }

    proptest! {
        /// Lexical order of the stored form is time order (index sort keys rely on it).
        #[test]
        fn lexical_order_is_time_order(a in 0i64..4_102_444_800_000, b in 0i64..4_102_444_800_000) {
            let (a, b) = (
                Timestamp::from(DateTime::from_timestamp_millis(a).unwrap()),
                Timestamp::from(DateTime::from_timestamp_millis(b).unwrap()),
            );
            prop_assert_eq!(a.cmp(&b), a.to_string().cmp(&b.to_string()));
        }
    }
}
