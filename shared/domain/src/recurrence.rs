//! When recurring schedules fire (issue 31): EventBridge Scheduler's schedule expressions, the
//! time zone they are read in, and the fire times they give within a schedule's window.
//!
//! (A schedule's identity, state, overlap policy and tick keys are [`crate::schedules`]; the
//! delayed start of a single job, `delay_seconds`/`not_before`, is [`crate::schedule`].)
//!
//! A schedule fires by the rules of Amazon EventBridge Scheduler, the service that fires it on
//! AWS, so that the local stack, which fires schedules from this module, behaves as AWS does:
//!
//! - **Expressions** are EventBridge Scheduler's: `cron(minutes hours day-of-month month
//!   day-of-week year)` (six fields; `?` in exactly one of the two day fields; `L`, `W`, `#`;
//!   names `JAN`–`DEC` and `SUN`–`SAT`; day-of-week `1`–`7` is `SUN`–`SAT`; years 1970–2199)
//!   and `rate(value unit)` (minute(s), hour(s), day(s); the singular unit with 1 only), as the
//!   EventBridge user guide's cron and rate references give them. [`ScheduleExpression`] checks
//!   that grammar itself, field by field, and hands the checked fields, translated, to
//!   `croner` (a maintained cron matcher that has `L`, `W`, `#`, a year field and Quartz's
//!   weekday numbering), which only matches wall-clock times.
//! - **Cron and time zones.** A cron expression is read in the schedule's IANA time zone, on
//!   local wall-clock time. On daylight saving time, EventBridge Scheduler's documentation
//!   (the user guide's "Schedule types" page, section on daylight saving time, and the AWS
//!   knowledge-center article "eventbridge-scheduler-adjust-dst") says: when clocks go
//!   forward, an invocation whose cron time falls in the hour that does not exist is skipped;
//!   when they go back, the schedule runs once, not again in the repeated hour. So here a
//!   wall-clock time that does not exist fires nothing (not at the end of the gap, as some
//!   cron libraries do), and a wall-clock time that occurs twice fires once. The
//!   documentation does not say at which of its two instants; this module fires at the first
//!   (the earlier one, still on summer time), when the wall clock first shows that time.
//! - **Rate and its anchor.** The same user guide page: a rate schedule begins at the start
//!   date set on the schedule (`StartDate` sets its first occurrence), and without one it
//!   begins invoking at once, when it is created. So a rate fires at its anchor — the
//!   schedule's `start_at`, else its creation — and every interval after. The knowledge-center
//!   article adds that a day in a rate is 24 hours of real time, also when a clock change
//!   makes the local day 23 or 25 hours: the next invocation is 24 hours after the last. A
//!   rate is a fixed span of real time; the time zone plays no part in it.
//! - **Window.** The CreateSchedule API reference: invocations may begin on or after
//!   `StartDate` and stop on or before `EndDate` (both in UTC). [`Recurrence`] fires nothing
//!   before `start_at` and nothing after `end_at`, both ends included.
//!
//! EventBridge invokes a target within the minute of its scheduled time (the user guide speaks
//! of 60-second precision); the times here are the scheduled times themselves, which is what
//! the `<aws.scheduler.scheduled-time>` context attribute carries.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, LocalResult, NaiveDate, TimeDelta, TimeZone, Utc};
use chrono_tz::Tz;
use serde::{Deserialize, Serialize};

/// Longest schedule expression, in bytes: EventBridge Scheduler's limit on `ScheduleExpression`.
pub const MAX_EXPRESSION_LEN: usize = 256;
/// Longest time zone name: EventBridge Scheduler's limit on `ScheduleExpressionTimezone`.
pub const MAX_TIME_ZONE_LEN: usize = 50;
/// The first year a cron expression's year field may name (EventBridge's range).
pub const FIRST_YEAR: i32 = 1970;
/// The last year a cron expression's year field may name: no cron schedule fires after it.
pub const LAST_YEAR: i32 = 2199;
/// The most fire times [`Recurrence::fires_between`] lists in one call, whatever limit it is
/// given: a year of `rate(1 minute)` is half a million.
pub const MAX_LISTED_FIRES: usize = 10_000;

/// How much of a caller's text an error quotes back.
const QUOTED_CHARS: usize = 64;

fn quoted(text: &str) -> String {
    text.chars().take(QUOTED_CHARS).collect()
}

// ---------------------------------------------------------------------------------------------
// Expressions
// ---------------------------------------------------------------------------------------------

/// A field of a cron expression, in the order the expression gives them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CronField {
    /// Minutes, 0–59.
    Minutes,
    /// Hours, 0–23.
    Hours,
    /// Day of the month, 1–31, or `?`, `L`, `LW`, `nW`.
    DayOfMonth,
    /// Month, 1–12 or `JAN`–`DEC`.
    Month,
    /// Day of the week, 1–7 or `SUN`–`SAT` (1 is Sunday), or `?`, `L`, `nL`, `n#k`.
    DayOfWeek,
    /// Year, 1970–2199.
    Year,
}

impl CronField {
    /// The field's name as EventBridge's documentation writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            CronField::Minutes => "minutes",
            CronField::Hours => "hours",
            CronField::DayOfMonth => "day-of-month",
            CronField::Month => "month",
            CronField::DayOfWeek => "day-of-week",
            CronField::Year => "year",
        }
    }

    /// The lowest and highest value the field takes.
    fn bounds(self) -> (u16, u16) {
        match self {
            CronField::Minutes => (0, 59),
            CronField::Hours => (0, 23),
            CronField::DayOfMonth => (1, 31),
            CronField::Month => (1, 12),
            CronField::DayOfWeek => (1, 7),
            CronField::Year => (FIRST_YEAR as u16, LAST_YEAR as u16),
        }
    }

    /// The names the field accepts for its values, from its lowest value up.
    fn names(self) -> &'static [&'static str] {
        match self {
            CronField::Month => &[
                "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
            ],
            CronField::DayOfWeek => &["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"],
            _ => &[],
        }
    }
}

impl fmt::Display for CronField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a text is not a schedule expression (a `422` problem can show the message as it is).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidScheduleExpression {
    /// Longer than [`MAX_EXPRESSION_LEN`].
    #[error("a schedule expression is at most {MAX_EXPRESSION_LEN} characters")]
    TooLong,
    /// Neither `cron(…)` nor `rate(…)`.
    #[error(
        "a schedule expression is cron(minutes hours day-of-month month day-of-week year) or \
         rate(value unit), e.g. cron(0 9 ? * MON-FRI *) or rate(15 minutes)"
    )]
    Unrecognised,
    /// A cron expression without exactly six fields.
    #[error("cron(…) takes 6 fields (minutes hours day-of-month month day-of-week year), not {0}")]
    FieldCount(usize),
    /// A cron field that does not parse, or names a value out of its range.
    #[error("cron(…) {field} field {text:?}: {reason}")]
    Field {
        /// Which field.
        field: CronField,
        /// The field's text (at most 64 characters of it).
        text: String,
        /// What is wrong with it.
        reason: String,
    },
    /// `?` in neither or both of day-of-month and day-of-week.
    #[error(
        "cron(…) takes ? in exactly one of day-of-month and day-of-week, e.g. cron(0 9 * * ? *) \
         or cron(0 9 ? * MON *)"
    )]
    DayFields,
    /// A cron expression that matches no time in 1970–2199 (`30 FEB`, `31 APR`…).
    #[error("cron(…) matches no date from {FIRST_YEAR} to {LAST_YEAR}, so it would never fire")]
    NeverFires,
    /// A rate expression without exactly a value and a unit.
    #[error("rate(…) takes a value and a unit, e.g. rate(5 minutes)")]
    RateShape,
    /// A rate value that is not a whole number of at least 1 (fits in 32 bits).
    #[error("a rate's value is a whole number from 1 to {max}, not {0:?}", max = u32::MAX)]
    RateValue(String),
    /// A rate unit other than minute(s), hour(s), day(s): nothing under a minute.
    #[error("a rate's unit is minute, minutes, hour, hours, day or days, not {0:?}")]
    RateUnit(String),
    /// A singular unit with a value other than 1, or a plural one with 1.
    #[error(
        "rate(1 …) takes the singular unit and any other value the plural, e.g. rate(1 hour), \
         rate(5 hours)"
    )]
    RateUnitNumber,
}

/// A schedule expression in EventBridge Scheduler's syntax: `cron(…)` or `rate(…)`.
///
/// Only a valid expression parses (or deserialises). It keeps its canonical text — one space
/// between fields, names and letters in upper case, a rate's value without leading zeros —
/// which it displays and serialises as, and which is what EventBridge is given: the same
/// schedule always has the same text. Equality is equality of that text.
#[derive(Clone)]
pub struct ScheduleExpression {
    text: String,
    kind: Kind,
}

#[derive(Clone)]
enum Kind {
    /// The matcher for the expression's local wall-clock times (boxed: it holds a bitmap per
    /// field, and a rate needs none of it).
    Cron(Box<croner::Cron>),
    /// The fixed span between firings.
    Rate(TimeDelta),
}

impl ScheduleExpression {
    /// The canonical text.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The interval of a `rate(…)` expression; `None` for `cron(…)`.
    pub fn interval(&self) -> Option<TimeDelta> {
        match &self.kind {
            Kind::Rate(every) => Some(*every),
            Kind::Cron(_) => None,
        }
    }

    /// The first fire time strictly after `after`.
    ///
    /// A cron expression is matched on wall-clock time in `timezone`: a time the clock skips
    /// in spring fires nothing, a time the clock shows twice in autumn fires once, at its
    /// first instant; nothing after [`LAST_YEAR`]. A rate fires at `anchor` and every interval
    /// after it (`timezone` plays no part); before `anchor`, its next fire is `anchor`. `None`
    /// when there is no later fire time.
    pub fn next_after(
        &self,
        after: DateTime<Utc>,
        timezone: &ScheduleTimeZone,
        anchor: DateTime<Utc>,
    ) -> Option<DateTime<Utc>> {
        match &self.kind {
            Kind::Cron(cron) => next_cron(cron, timezone.tz(), after),
            Kind::Rate(every) => next_rate(*every, anchor, after),
        }
    }
}

/// The first instant after `after` whose wall-clock time in `tz` the cron matches, and which
/// is the first instant showing that wall-clock time.
fn next_cron(cron: &croner::Cron, tz: Tz, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
    // Walk matching wall-clock times from the one `after` shows. Each one maps to no instant
    // (skipped by the spring change), one, or two (repeated by the autumn change), of which
    // only the first fires. A wall-clock time at or before `after`'s maps to instants at or
    // before `after` (its first instant, at least), so none of those can be next; a later one
    // can still be at or before `after` when `after` is in the repeated hour's second pass
    // (its first instant fired in the first pass), and is passed over.
    let mut wall = after.with_timezone(&tz).naive_local();
    loop {
        // Strictly after `wall` (croner steps to the next whole second first), so every turn
        // moves on. The year field never names a year after 2199 (see `translate_list`), so
        // past its last match croner walks the years to its limit, 5000, and gives up.
        let candidate = cron.find_next_occurrence(&wall, false).ok()?;
        let first_instant = match tz.from_local_datetime(&candidate) {
            LocalResult::Single(at) | LocalResult::Ambiguous(at, _) => Some(at.to_utc()),
            LocalResult::None => None,
        };
        if let Some(at) = first_instant
            && at > after
        {
            return Some(at);
        }
        wall = candidate;
    }
}

/// The first `anchor + k × every` (k ≥ 0) after `after`.
fn next_rate(
    every: TimeDelta,
    anchor: DateTime<Utc>,
    after: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    if after < anchor {
        return Some(anchor);
    }
    // Whole intervals elapsed, in nanoseconds (i128: no span between two chrono times
    // overflows it). `every` is a whole number of seconds of at least 60.
    let elapsed = after - anchor;
    let elapsed_ns =
        i128::from(elapsed.num_seconds()) * 1_000_000_000 + i128::from(elapsed.subsec_nanos());
    let every_ns = i128::from(every.num_seconds()) * 1_000_000_000;
    let k = i64::try_from(elapsed_ns / every_ns + 1).ok()?;
    let offset = TimeDelta::try_seconds(every.num_seconds().checked_mul(k)?)?;
    anchor.checked_add_signed(offset)
}

impl FromStr for ScheduleExpression {
    type Err = InvalidScheduleExpression;

    /// Parses `cron(…)` or `rate(…)` (surrounding white space and runs of white space between
    /// fields are allowed; the keyword is lower case).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.len() > MAX_EXPRESSION_LEN {
            return Err(InvalidScheduleExpression::TooLong);
        }
        let text = text.trim();
        let inner = |keyword: &str| {
            text.strip_prefix(keyword)
                .and_then(|rest| rest.strip_suffix(')'))
                .filter(|inner| !inner.contains(['(', ')']))
        };
        if let Some(fields) = inner("cron(") {
            parse_cron(fields)
        } else if let Some(rate) = inner("rate(") {
            parse_rate(rate)
        } else {
            Err(InvalidScheduleExpression::Unrecognised)
        }
    }
}

fn parse_rate(inner: &str) -> Result<ScheduleExpression, InvalidScheduleExpression> {
    let parts: Vec<&str> = inner.split_whitespace().collect();
    let [value, unit] = parts[..] else {
        return Err(InvalidScheduleExpression::RateShape);
    };
    let count = Some(value)
        .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|v| v.parse::<u32>().ok())
        .filter(|&v| v >= 1)
        .ok_or_else(|| InvalidScheduleExpression::RateValue(quoted(value)))?;
    let (seconds, singular) = match unit {
        "minute" => (60, true),
        "minutes" => (60, false),
        "hour" => (3_600, true),
        "hours" => (3_600, false),
        "day" => (86_400, true),
        "days" => (86_400, false),
        other => return Err(InvalidScheduleExpression::RateUnit(quoted(other))),
    };
    // EventBridge's rate reference: a value of 1 takes the singular unit, a larger value the
    // plural (`rate(1 hours)` and `rate(5 hour)` are both invalid).
    if singular != (count == 1) {
        return Err(InvalidScheduleExpression::RateUnitNumber);
    }
    // At most 4,294,967,295 days: about 3.7e14 seconds, well inside a `TimeDelta`.
    let every = TimeDelta::try_seconds(i64::from(count) * seconds)
        .ok_or_else(|| InvalidScheduleExpression::RateValue(quoted(value)))?;
    Ok(ScheduleExpression { text: format!("rate({count} {unit})"), kind: Kind::Rate(every) })
}

fn parse_cron(inner: &str) -> Result<ScheduleExpression, InvalidScheduleExpression> {
    let fields: Vec<String> = inner.split_whitespace().map(str::to_ascii_uppercase).collect();
    let Ok::<&[String; 6], _>([minutes, hours, dom, month, dow, year]) =
        fields.as_slice().try_into()
    else {
        return Err(InvalidScheduleExpression::FieldCount(fields.len()));
    };
    let field_error = |field: CronField, text: &str| {
        let text = quoted(text);
        move |reason: String| InvalidScheduleExpression::Field { field, text, reason }
    };
    // Each field checked against EventBridge's grammar and translated to croner's (below).
    let translated = [
        translate_list(CronField::Minutes, minutes)
            .map_err(field_error(CronField::Minutes, minutes))?,
        translate_list(CronField::Hours, hours).map_err(field_error(CronField::Hours, hours))?,
        translate_day_of_month(dom).map_err(field_error(CronField::DayOfMonth, dom))?,
        translate_list(CronField::Month, month).map_err(field_error(CronField::Month, month))?,
        translate_day_of_week(dow).map_err(field_error(CronField::DayOfWeek, dow))?,
        translate_list(CronField::Year, year).map_err(field_error(CronField::Year, year))?,
    ];
    // EventBridge's cron reference: the two day fields cannot both be given; a value or `*`
    // in one needs `?` in the other.
    if (dom == "?") == (dow == "?") {
        return Err(InvalidScheduleExpression::DayFields);
    }

    // croner reads `sec min hour dom month dow year`; the second is always 0 (EventBridge's
    // granularity is the minute). Quartz weekdays make its 1–7 Sunday–Saturday, as
    // EventBridge's; everything else it is given is already in its plain syntax.
    let pattern = format!("0 {}", translated.join(" "));
    let cron = croner::parser::CronParser::builder()
        .seconds(croner::parser::Seconds::Required)
        .year(croner::parser::Year::Required)
        .alternative_weekdays(true)
        .dom_and_dow(false)
        .build()
        .parse(&pattern)
        // croner refuses nothing the translation produces (every valid expression in the tests
        // goes through it); should it ever, the caller's text is refused, not a panic.
        .map_err(|_| InvalidScheduleExpression::Unrecognised)?;
    if never_fires(&cron) {
        return Err(InvalidScheduleExpression::NeverFires);
    }
    Ok(ScheduleExpression {
        text: format!("cron({})", fields.join(" ")),
        kind: Kind::Cron(Box::new(cron)),
    })
}

/// Whether `cron` matches no time in 1970–2199 (`30 FEB`, `31 APR,JUN`, `29 FEB 2100`).
fn never_fires(cron: &croner::Cron) -> bool {
    let pattern = &cron.pattern;
    // A plain list of days of the month (the usual mistake) is decided on the calendar: some
    // listed day must fit some listed month (29 February in some listed leap year). A search
    // would walk every day of 230 years to find that nothing matches.
    if !pattern.is_dom_wildcard() && !pattern.days.has_modifiers() {
        let leap = pattern
            .years
            .values()
            .into_iter()
            .any(|year| NaiveDate::from_ymd_opt(i32::from(year), 2, 29).is_some());
        let fits = |day: u16, month: u16| match month {
            2 => day <= if leap { 29 } else { 28 },
            4 | 6 | 9 | 11 => day <= 30,
            _ => true,
        };
        let months = pattern.months.values();
        return !pattern.days.values().into_iter().any(|d| months.iter().any(|&m| fits(d, m)));
    }
    // Anything else (L, W, #, a weekday, every day) has a day in every month, or in some
    // month of most years: a search finds it within years, unless the year field rules them
    // out, and then it only walks the years named.
    let epoch = NaiveDate::from_ymd_opt(FIRST_YEAR, 1, 1)
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .expect("1970-01-01 exists");
    cron.find_next_occurrence(&epoch, true).is_err()
}

/// One value of `field`: a number in its range, or (month, day-of-week) a name.
fn field_value(field: CronField, token: &str) -> Result<u16, String> {
    let (min, max) = field.bounds();
    if token.is_empty() {
        return Err("a number is missing (before or after -, / or ,)".into());
    }
    if token == "?" {
        return Err("? stands alone, and only in day-of-month or day-of-week".into());
    }
    if token.len() <= 4 && token.bytes().all(|b| b.is_ascii_digit()) {
        let value: u16 = token.parse().map_err(|_| format!("{token} is not a number"))?;
        return if (min..=max).contains(&value) {
            Ok(value)
        } else {
            Err(format!("{value} is out of range {min}-{max}"))
        };
    }
    let names = field.names();
    if let Some(index) = names.iter().position(|name| *name == token) {
        return Ok(min + index as u16);
    }
    Err(match (names.first(), names.last()) {
        (Some(first), Some(last)) => {
            format!("{token:?} is not a number from {min} to {max} nor a name {first}-{last}")
        }
        _ => format!("{token:?} is not a number from {min} to {max}"),
    })
}

/// A list of values, ranges and increments (`,` `-` `*` `/`), translated to croner's syntax:
/// names become numbers, and every increment gets an explicit range. EventBridge's `a/n` is
/// "every n-th from a" (croner's strict syntax has no such form: it becomes `a-max/n`), and
/// `*/n` starts at the field's lowest value — for the year field 1970, where croner's own
/// lowest year is 1, so it is spelled `1970-2199/n`.
fn translate_list(field: CronField, text: &str) -> Result<String, String> {
    let (min, max) = field.bounds();
    if text == "*" {
        // The year field's `*` is spelled out: croner's own runs to year 5000, and with it a
        // search for a time that never comes would walk 3,000 years day by day.
        return Ok(if field == CronField::Year { format!("{min}-{max}") } else { "*".into() });
    }
    let mut items = Vec::new();
    for item in text.split(',') {
        if item.is_empty() {
            return Err("a list has an empty item".into());
        }
        if item == "*" {
            return Err("* stands alone, not in a list".into());
        }
        let range = |range: &str| -> Result<(u16, u16), String> {
            let (low, high) = match range.split_once('-') {
                Some((low, high)) => (field_value(field, low)?, field_value(field, high)?),
                None => {
                    let value = field_value(field, range)?;
                    (value, value)
                }
            };
            if low > high {
                return Err(format!("the range {range} goes down; write it from low to high"));
            }
            Ok((low, high))
        };
        items.push(match item.split_once('/') {
            Some((start, step)) => {
                if field == CronField::DayOfWeek {
                    return Err("day-of-week takes no / increment".into());
                }
                let largest = max - min;
                let step = Some(step)
                    .filter(|s| {
                        !s.is_empty() && s.len() <= 4 && s.bytes().all(|b| b.is_ascii_digit())
                    })
                    .and_then(|s| s.parse::<u16>().ok())
                    .filter(|s| (1..=largest).contains(s))
                    .ok_or_else(|| {
                        format!("the increment after / is a whole number from 1 to {largest}")
                    })?;
                let (low, high) = match start {
                    "*" => (min, max),
                    _ if start.contains('-') => range(start)?,
                    _ => (field_value(field, start)?, max),
                };
                format!("{low}-{high}/{step}")
            }
            None => match range(item)? {
                (low, high) if low == high => low.to_string(),
                (low, high) => format!("{low}-{high}"),
            },
        });
    }
    Ok(items.join(","))
}

/// Day-of-month: `?`, `L` (last day), `LW` (last weekday), `nW` (the weekday nearest day n,
/// within the month), or a list. The letters stand alone: EventBridge documents them as
/// whole-field forms, and a list mixing them is refused rather than guessed at.
fn translate_day_of_month(text: &str) -> Result<String, String> {
    match text {
        // croner's `*` is "any day" too; it then matches on day-of-week alone.
        "?" => Ok("*".into()),
        "L" | "LW" => Ok(text.into()),
        _ if text.contains(['L', 'W']) => {
            let day = text
                .strip_suffix('W')
                .filter(|day| day.bytes().all(|b| b.is_ascii_digit()))
                .ok_or("L, LW and nW (e.g. 15W) stand alone in day-of-month")?;
            Ok(format!("{}W", field_value(CronField::DayOfMonth, day)?))
        }
        _ => translate_list(CronField::DayOfMonth, text),
    }
}

/// Day-of-week: `?`, `L` (the last day of the week, Saturday), `nL` (the month's last
/// weekday n), `n#k` (its k-th weekday n, k from 1 to 5), or a list without increments (the
/// cron reference lists no `/` for this field). `L` and `#` stand alone: the reference allows
/// one expression in the field when it uses `#` (`3#1,6#3` is invalid).
fn translate_day_of_week(text: &str) -> Result<String, String> {
    match text {
        "?" => Ok("*".into()),
        // croner reads a bare `L` in this field as nothing at all: Saturday is spelled out.
        "L" => Ok("7".into()),
        _ if text.contains(['L', '#']) && text.contains([',', '-', '/', '*']) => {
            Err("L and # stand alone in day-of-week: one nL or n#k, not a list or range".into())
        }
        _ => {
            if let Some((day, nth)) = text.split_once('#') {
                let day = field_value(CronField::DayOfWeek, day)?;
                let nth = Some(nth)
                    .filter(|n| n.len() == 1)
                    .and_then(|n| n.parse::<u8>().ok())
                    .filter(|n| (1..=5).contains(n))
                    .ok_or("the number after # is from 1 to 5 (the month's 1st to 5th)")?;
                Ok(format!("{day}#{nth}"))
            } else if let Some(day) = text.strip_suffix('L') {
                Ok(format!("{}L", field_value(CronField::DayOfWeek, day)?))
            } else if text.contains('L') {
                Err("L is the last day of the week, or follows one day (e.g. 6L)".into())
            } else {
                translate_list(CronField::DayOfWeek, text)
            }
        }
    }
}

impl fmt::Display for ScheduleExpression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl fmt::Debug for ScheduleExpression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ScheduleExpression").field(&self.text).finish()
    }
}

impl PartialEq for ScheduleExpression {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl Eq for ScheduleExpression {}

impl std::hash::Hash for ScheduleExpression {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.text.hash(state);
    }
}

impl Serialize for ScheduleExpression {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.text)
    }
}

impl<'de> Deserialize<'de> for ScheduleExpression {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = Cow::<'de, str>::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

// ---------------------------------------------------------------------------------------------
// Time zones
// ---------------------------------------------------------------------------------------------

/// The IANA time zone a schedule's cron expression is read in (`Europe/Berlin`); UTC by
/// default. Only a name in the IANA database (as `chrono-tz` ships it, links such as
/// `US/Eastern` included; names are case-sensitive) parses or deserialises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ScheduleTimeZone(Tz);

/// A text that is not an IANA time zone name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown time zone {text:?}: give an IANA name such as UTC, Europe/Berlin or America/New_York"
)]
pub struct InvalidTimeZone {
    /// The text (at most 64 characters of it).
    pub text: String,
}

impl ScheduleTimeZone {
    /// UTC, the default.
    pub const UTC: ScheduleTimeZone = ScheduleTimeZone(Tz::UTC);

    /// The IANA name.
    pub fn as_str(self) -> &'static str {
        self.0.name()
    }

    /// The zone, for converting times.
    pub fn tz(self) -> Tz {
        self.0
    }
}

impl Default for ScheduleTimeZone {
    fn default() -> Self {
        ScheduleTimeZone::UTC
    }
}

impl FromStr for ScheduleTimeZone {
    type Err = InvalidTimeZone;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Some(text)
            .filter(|t| t.len() <= MAX_TIME_ZONE_LEN)
            .and_then(|t| t.parse::<Tz>().ok())
            .map(ScheduleTimeZone)
            .ok_or_else(|| InvalidTimeZone { text: quoted(text) })
    }
}

impl fmt::Display for ScheduleTimeZone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for ScheduleTimeZone {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ScheduleTimeZone {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = Cow::<'de, str>::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

// ---------------------------------------------------------------------------------------------
// When a schedule fires
// ---------------------------------------------------------------------------------------------

/// When one schedule fires: its expression, read in its time zone, anchored (a rate) at its
/// `start_at` or else its creation, within its `start_at`..=`end_at` window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recurrence {
    expression: ScheduleExpression,
    timezone: ScheduleTimeZone,
    anchor: DateTime<Utc>,
    start_at: Option<DateTime<Utc>>,
    end_at: Option<DateTime<Utc>>,
}

/// A window whose end is not after its start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("end_at must be later than start_at")]
pub struct InvalidWindow;

/// Fire times listed by [`Recurrence::fires_between`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Fires {
    /// The fire times, earliest first.
    pub times: Vec<DateTime<Utc>>,
    /// Whether the range holds more fire times than were listed.
    pub more: bool,
}

impl Recurrence {
    /// The recurrence of a schedule created at `created_at`, firing no earlier than `start_at`
    /// and no later than `end_at` (either open when `None`).
    pub fn new(
        expression: ScheduleExpression,
        timezone: ScheduleTimeZone,
        created_at: DateTime<Utc>,
        start_at: Option<DateTime<Utc>>,
        end_at: Option<DateTime<Utc>>,
    ) -> Result<Self, InvalidWindow> {
        if let (Some(start), Some(end)) = (start_at, end_at)
            && end <= start
        {
            return Err(InvalidWindow);
        }
        let anchor = start_at.unwrap_or(created_at);
        Ok(Recurrence { expression, timezone, anchor, start_at, end_at })
    }

    /// The expression.
    pub fn expression(&self) -> &ScheduleExpression {
        &self.expression
    }

    /// The time zone the expression is read in.
    pub fn timezone(&self) -> ScheduleTimeZone {
        self.timezone
    }

    /// Where a rate counts its intervals from: `start_at`, else the creation time.
    pub fn anchor(&self) -> DateTime<Utc> {
        self.anchor
    }

    /// The first fire time strictly after `after`, within the window; `None` if there is
    /// none (the window has closed, or a cron's years are over).
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let after = match self.start_at {
            // "at or after start_at" is "after the instant just before it".
            Some(start) if start > after => just_before(start),
            _ => after,
        };
        let next = self.expression.next_after(after, &self.timezone, self.anchor)?;
        match self.end_at {
            Some(end) if next > end => None,
            _ => Some(next),
        }
    }

    /// The first fire time at or after `from`, within the window (a new schedule's first
    /// fire is `next_from(created_at)`: a rate without `start_at` fires at once).
    pub fn next_from(&self, from: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.next_after(just_before(from))
    }

    /// The fire times in `[from, until)`, earliest first: at most `limit` of them, and never
    /// more than [`MAX_LISTED_FIRES`]; [`Fires::more`] tells whether the range holds more.
    pub fn fires_between(&self, from: DateTime<Utc>, until: DateTime<Utc>, limit: usize) -> Fires {
        let limit = limit.min(MAX_LISTED_FIRES);
        let mut times = Vec::new();
        let mut next = self.next_from(from);
        while let Some(at) = next.filter(|at| *at < until) {
            if times.len() == limit {
                return Fires { times, more: true };
            }
            times.push(at);
            next = self.next_after(at);
        }
        Fires { times, more: false }
    }
}

/// The instant one nanosecond (chrono's resolution) before `at`.
fn just_before(at: DateTime<Utc>) -> DateTime<Utc> {
    at.checked_sub_signed(TimeDelta::nanoseconds(1)).unwrap_or(at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Datelike;
    use proptest::prelude::*;

    fn t(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text).unwrap().to_utc()
    }

    fn expr(text: &str) -> ScheduleExpression {
        text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    fn zone(name: &str) -> ScheduleTimeZone {
        name.parse().unwrap()
    }

    /// The recurrence of `expression` in `tz`, created long ago, with no window.
    fn open(expression: &str, tz: &str) -> Recurrence {
        Recurrence::new(expr(expression), zone(tz), t("2000-01-01T00:00:00Z"), None, None).unwrap()
    }

    fn field(field: CronField, text: &str, reason: &str) -> InvalidScheduleExpression {
        InvalidScheduleExpression::Field { field, text: text.into(), reason: reason.into() }
    }

    #[test]
    fn expressions_parse_to_their_canonical_text() {
        for (input, canonical) in [
            // The EventBridge user guide's examples.
            ("cron(0 10 * * ? *)", "cron(0 10 * * ? *)"),
            ("cron(15 12 * * ? *)", "cron(15 12 * * ? *)"),
            ("cron(0 18 ? * MON-FRI *)", "cron(0 18 ? * MON-FRI *)"),
            ("cron(0 8 1 * ? *)", "cron(0 8 1 * ? *)"),
            ("cron(0/15 * * * ? *)", "cron(0/15 * * * ? *)"),
            ("cron(0/10 * ? * MON-FRI *)", "cron(0/10 * ? * MON-FRI *)"),
            ("cron(0/5 8-17 ? * MON-FRI *)", "cron(0/5 8-17 ? * MON-FRI *)"),
            ("cron(0 9 ? * 2#1 *)", "cron(0 9 ? * 2#1 *)"),
            // White space and letter case are normalised.
            ("  cron( 0  9 ?   * mon#1 * )  ", "cron(0 9 ? * MON#1 *)"),
            ("cron(0 0 1 jan,Jul ? 2026-2030)", "cron(0 0 1 JAN,JUL ? 2026-2030)"),
            ("cron(0 12 l * ? *)", "cron(0 12 L * ? *)"),
            ("cron(0 9 lw * ? *)", "cron(0 9 LW * ? *)"),
            ("cron(0 9 15w * ? *)", "cron(0 9 15W * ? *)"),
            ("cron(0 18 ? * 6L *)", "cron(0 18 ? * 6L *)"),
            ("cron(0 18 ? * FRIL *)", "cron(0 18 ? * FRIL *)"),
            ("cron(0 8 ? * L *)", "cron(0 8 ? * L *)"),
            ("cron(5-50/10 */2 1-15 */3 ? 2030/5)", "cron(5-50/10 */2 1-15 */3 ? 2030/5)"),
            ("cron(0 0 ? * SUN,7 *)", "cron(0 0 ? * SUN,7 *)"),
            ("cron(0 0 ? * * *)", "cron(0 0 ? * * *)"),
            ("cron(59 23 31 DEC ? 2199)", "cron(59 23 31 DEC ? 2199)"),
            ("cron(0 0 1 1 ? 1970)", "cron(0 0 1 1 ? 1970)"),
            ("cron(0 0 29 FEB ? *)", "cron(0 0 29 FEB ? *)"),
            ("cron(0 0 29 FEB ? 2096,2100)", "cron(0 0 29 FEB ? 2096,2100)"),
            ("cron(0 0 31 JAN-APR ? *)", "cron(0 0 31 JAN-APR ? *)"),
            ("cron(0 0 ? FEB 1#5 *)", "cron(0 0 ? FEB 1#5 *)"),
            ("rate(1 minute)", "rate(1 minute)"),
            ("rate(5 minutes)", "rate(5 minutes)"),
            ("rate(1 hour)", "rate(1 hour)"),
            ("rate(12 hours)", "rate(12 hours)"),
            ("rate(1 day)", "rate(1 day)"),
            ("rate(7 days)", "rate(7 days)"),
            (" rate( 05   minutes ) ", "rate(5 minutes)"),
            ("rate(4294967295 days)", "rate(4294967295 days)"),
        ] {
            let parsed = expr(input);
            assert_eq!(parsed.as_str(), canonical, "{input}");
            assert_eq!(parsed.to_string(), canonical);
            assert_eq!(expr(canonical), parsed, "the canonical text parses to the same");
        }
    }

    #[test]
    fn invalid_expressions_are_refused_with_the_reason() {
        use CronField::*;
        use InvalidScheduleExpression as E;
        let long = format!("rate({} minutes)", "1".repeat(300));
        let cases: Vec<(&str, InvalidScheduleExpression)> = vec![
            ("", E::Unrecognised),
            ("cron", E::Unrecognised),
            ("0 10 * * ? *", E::Unrecognised),
            ("CRON(0 10 * * ? *)", E::Unrecognised),
            ("cron(0 10 * * ? *", E::Unrecognised),
            ("cron(0 10 * * ? *))", E::Unrecognised),
            ("cron(0 10 * * ? *) extra", E::Unrecognised),
            ("at(2026-01-01T00:00:00)", E::Unrecognised),
            (&long, E::TooLong),
            ("cron()", E::FieldCount(0)),
            ("cron(0 10 * * ?)", E::FieldCount(5)),
            ("cron(0 0 10 * * ? *)", E::FieldCount(7)),
            ("cron(0 10 * * * *)", E::DayFields),
            ("cron(0 10 ? * ? *)", E::DayFields),
            ("cron(0 10 1 * MON *)", E::DayFields),
            ("cron(60 10 * * ? *)", field(Minutes, "60", "60 is out of range 0-59")),
            (
                "cron(-1 10 * * ? *)",
                field(Minutes, "-1", "a number is missing (before or after -, / or ,)"),
            ),
            (
                "cron(0 10/ * * ? *)",
                field(Hours, "10/", "the increment after / is a whole number from 1 to 23"),
            ),
            (
                "cron(? 10 * * ? *)",
                field(Minutes, "?", "? stands alone, and only in day-of-month or day-of-week"),
            ),
            ("cron(0 24 * * ? *)", field(Hours, "24", "24 is out of range 0-23")),
            ("cron(0 10 0 * ? *)", field(DayOfMonth, "0", "0 is out of range 1-31")),
            ("cron(0 10 32 * ? *)", field(DayOfMonth, "32", "32 is out of range 1-31")),
            ("cron(0 10 * 13 ? *)", field(Month, "13", "13 is out of range 1-12")),
            (
                "cron(0 10 * FOO ? *)",
                field(Month, "FOO", "\"FOO\" is not a number from 1 to 12 nor a name JAN-DEC"),
            ),
            (
                "cron(0 10 ? MON * *)",
                field(Month, "MON", "\"MON\" is not a number from 1 to 12 nor a name JAN-DEC"),
            ),
            // Unix cron's Sunday 0 is not EventBridge's: its days are 1-7.
            ("cron(0 10 ? * 0 *)", field(DayOfWeek, "0", "0 is out of range 1-7")),
            ("cron(0 10 ? * 8 *)", field(DayOfWeek, "8", "8 is out of range 1-7")),
            (
                "cron(0 10 ? * JAN *)",
                field(DayOfWeek, "JAN", "\"JAN\" is not a number from 1 to 7 nor a name SUN-SAT"),
            ),
            ("cron(0 10 * * ? 1969)", field(Year, "1969", "1969 is out of range 1970-2199")),
            ("cron(0 10 * * ? 2200)", field(Year, "2200", "2200 is out of range 1970-2199")),
            (
                "cron(0 10 ? * MON/2 *)",
                field(DayOfWeek, "MON/2", "day-of-week takes no / increment"),
            ),
            (
                "cron(0 10 ? * 2#6 *)",
                field(
                    DayOfWeek,
                    "2#6",
                    "the number after # is from 1 to 5 (the month's 1st to 5th)",
                ),
            ),
            (
                "cron(0 10 ? * 2#0 *)",
                field(
                    DayOfWeek,
                    "2#0",
                    "the number after # is from 1 to 5 (the month's 1st to 5th)",
                ),
            ),
            (
                "cron(0 10 ? * 2#1,6#3 *)",
                field(
                    DayOfWeek,
                    "2#1,6#3",
                    "L and # stand alone in day-of-week: one nL or n#k, not a list or range",
                ),
            ),
            (
                "cron(0 10 ? * MON-FRI#2 *)",
                field(
                    DayOfWeek,
                    "MON-FRI#2",
                    "L and # stand alone in day-of-week: one nL or n#k, not a list or range",
                ),
            ),
            (
                "cron(0 10 ? * 6L,7 *)",
                field(
                    DayOfWeek,
                    "6L,7",
                    "L and # stand alone in day-of-week: one nL or n#k, not a list or range",
                ),
            ),
            ("cron(0 10 ? * 8L *)", field(DayOfWeek, "8L", "8 is out of range 1-7")),
            (
                "cron(0 10 L-3 * ? *)",
                field(DayOfMonth, "L-3", "L, LW and nW (e.g. 15W) stand alone in day-of-month"),
            ),
            (
                "cron(0 10 1,L * ? *)",
                field(DayOfMonth, "1,L", "L, LW and nW (e.g. 15W) stand alone in day-of-month"),
            ),
            (
                "cron(0 10 1-5W * ? *)",
                field(DayOfMonth, "1-5W", "L, LW and nW (e.g. 15W) stand alone in day-of-month"),
            ),
            ("cron(0 10 32W * ? *)", field(DayOfMonth, "32W", "32 is out of range 1-31")),
            (
                "cron(0/0 10 * * ? *)",
                field(Minutes, "0/0", "the increment after / is a whole number from 1 to 59"),
            ),
            (
                "cron(0/60 10 * * ? *)",
                field(Minutes, "0/60", "the increment after / is a whole number from 1 to 59"),
            ),
            (
                "cron(30-10 * * * ? *)",
                field(Minutes, "30-10", "the range 30-10 goes down; write it from low to high"),
            ),
            (
                "cron(0 10 ? * FRI-MON *)",
                field(
                    DayOfWeek,
                    "FRI-MON",
                    "the range FRI-MON goes down; write it from low to high",
                ),
            ),
            ("cron(1,,2 * * * ? *)", field(Minutes, "1,,2", "a list has an empty item")),
            ("cron(*,5 * * * ? *)", field(Minutes, "*,5", "* stands alone, not in a list")),
            ("cron(0 10 30 FEB ? *)", E::NeverFires),
            ("cron(0 10 31 APR,JUN ? *)", E::NeverFires),
            ("cron(0 0 29 FEB ? 2100)", E::NeverFires),
            ("cron(0 0 29,30 FEB ? 2097-2099)", E::NeverFires),
            // Found by searching: a fifth Sunday in February needs a leap year.
            ("cron(0 0 ? FEB 1#5 2026-2199/4)", E::NeverFires),
            ("cron(0 0 31W FEB,APR ? *)", E::NeverFires),
            ("rate(0 minutes)", E::RateValue("0".into())),
            ("rate(-1 minutes)", E::RateValue("-1".into())),
            ("rate(1.5 hours)", E::RateValue("1.5".into())),
            ("rate(five minutes)", E::RateValue("five".into())),
            ("rate(4294967296 days)", E::RateValue("4294967296".into())),
            ("rate(30 seconds)", E::RateUnit("seconds".into())),
            ("rate(1 second)", E::RateUnit("second".into())),
            ("rate(5 Minutes)", E::RateUnit("Minutes".into())),
            ("rate(2 weeks)", E::RateUnit("weeks".into())),
            ("rate(1 minutes)", E::RateUnitNumber),
            ("rate(5 minute)", E::RateUnitNumber),
            ("rate(5)", E::RateShape),
            ("rate()", E::RateShape),
            ("rate(5 minutes now)", E::RateShape),
        ];
        for (input, expected) in cases {
            assert_eq!(input.parse::<ScheduleExpression>().unwrap_err(), expected, "{input}");
        }
    }

    #[test]
    fn errors_read_as_a_problem_detail() {
        let error = "cron(0 10 ? * 0 *)".parse::<ScheduleExpression>().unwrap_err();
        assert_eq!(error.to_string(), "cron(…) day-of-week field \"0\": 0 is out of range 1-7");
        let error = "cron(0 10 * * * *)".parse::<ScheduleExpression>().unwrap_err();
        assert!(error.to_string().contains("? in exactly one of"), "{error}");
        let error = "rate(30 seconds)".parse::<ScheduleExpression>().unwrap_err();
        assert_eq!(
            error.to_string(),
            "a rate's unit is minute, minutes, hour, hours, day or days, not \"seconds\""
        );
    }

    #[test]
    fn expressions_serialise_as_their_text_and_deserialise_by_parsing() {
        let parsed: ScheduleExpression =
            serde_json::from_str(r#""cron(0 9 ? * mon-fri *)""#).unwrap();
        assert_eq!(serde_json::to_string(&parsed).unwrap(), r#""cron(0 9 ? * MON-FRI *)""#);
        let error = serde_json::from_str::<ScheduleExpression>(r#""rate(30 seconds)""#)
            .unwrap_err()
            .to_string();
        assert!(error.contains("a rate's unit is"), "{error}");
        assert!(serde_json::from_str::<ScheduleExpression>("5").is_err());
        assert_eq!(expr("rate(5 minutes)").interval(), Some(TimeDelta::minutes(5)));
        assert_eq!(expr("rate(1 day)").interval(), Some(TimeDelta::hours(24)));
        assert_eq!(expr("cron(0 10 * * ? *)").interval(), None);
    }

    #[test]
    fn cron_next_fire_times() {
        let none = None::<&str>;
        for (expression, tz, after, expected) in [
            ("cron(0 10 * * ? *)", "UTC", "2026-01-01T09:00:00Z", Some("2026-01-01T10:00:00Z")),
            // Strictly after: a fire time is not its own next.
            ("cron(0 10 * * ? *)", "UTC", "2026-01-01T10:00:00Z", Some("2026-01-02T10:00:00Z")),
            ("cron(0 10 * * ? *)", "UTC", "2026-01-01T09:59:59.999Z", Some("2026-01-01T10:00:00Z")),
            ("cron(0 10 * * ? *)", "UTC", "2026-01-01T10:00:00.001Z", Some("2026-01-02T10:00:00Z")),
            // L: the month's last day, leap years included.
            ("cron(0 12 L * ? *)", "UTC", "2026-02-10T00:00:00Z", Some("2026-02-28T12:00:00Z")),
            ("cron(0 12 L * ? *)", "UTC", "2028-02-10T00:00:00Z", Some("2028-02-29T12:00:00Z")),
            // LW: the last weekday (31 May 2026 is a Sunday, the 30th a Saturday).
            ("cron(0 9 LW * ? *)", "UTC", "2026-05-01T00:00:00Z", Some("2026-05-29T09:00:00Z")),
            // 15W: 15 August 2026 is a Saturday, so Friday the 14th.
            ("cron(0 9 15W * ? *)", "UTC", "2026-08-01T00:00:00Z", Some("2026-08-14T09:00:00Z")),
            // 1W: 1 August 2026 is a Saturday; W stays in the month, so Monday the 3rd.
            ("cron(0 9 1W * ? *)", "UTC", "2026-07-31T12:00:00Z", Some("2026-08-03T09:00:00Z")),
            // 6#3: the third Friday (January 2026's Fridays: 2, 9, 16).
            ("cron(0 10 ? * 6#3 *)", "UTC", "2026-01-01T00:00:00Z", Some("2026-01-16T10:00:00Z")),
            ("cron(0 10 ? * FRI#3 *)", "UTC", "2026-01-01T00:00:00Z", Some("2026-01-16T10:00:00Z")),
            // 1#5: a fifth Sunday; January and February 2026 have none, March does (the 29th).
            ("cron(0 0 ? * 1#5 *)", "UTC", "2026-01-01T00:00:00Z", Some("2026-03-29T00:00:00Z")),
            // 6L: the last Friday of the month.
            ("cron(0 18 ? * 6L *)", "UTC", "2026-01-01T00:00:00Z", Some("2026-01-30T18:00:00Z")),
            // L in day-of-week: the last day of the week, Saturday (1 January 2026 is a Thursday).
            ("cron(0 8 ? * L *)", "UTC", "2026-01-01T00:00:00Z", Some("2026-01-03T08:00:00Z")),
            // 1 is Sunday, 7 Saturday.
            ("cron(0 10 ? * 1 *)", "UTC", "2026-01-01T00:00:00Z", Some("2026-01-04T10:00:00Z")),
            ("cron(0 10 ? * 7 *)", "UTC", "2026-01-01T00:00:00Z", Some("2026-01-03T10:00:00Z")),
            (
                "cron(0 10 ? * MON-FRI *)",
                "UTC",
                "2026-01-02T10:00:00Z",
                Some("2026-01-05T10:00:00Z"),
            ),
            (
                "cron(0 12 * JAN,JUL ? *)",
                "UTC",
                "2026-01-31T12:00:00Z",
                Some("2026-07-01T12:00:00Z"),
            ),
            ("cron(0 0 29 FEB ? *)", "UTC", "2026-03-01T00:00:00Z", Some("2028-02-29T00:00:00Z")),
            ("cron(0/15 * * * ? *)", "UTC", "2026-01-01T10:07:00Z", Some("2026-01-01T10:15:00Z")),
            (
                "cron(5-50/10 * * * ? *)",
                "UTC",
                "2026-01-01T10:05:00Z",
                Some("2026-01-01T10:15:00Z"),
            ),
            (
                "cron(5-50/10 * * * ? *)",
                "UTC",
                "2026-01-01T10:46:00Z",
                Some("2026-01-01T11:05:00Z"),
            ),
            ("cron(1/20 * * * ? *)", "UTC", "2026-01-01T10:42:00Z", Some("2026-01-01T11:01:00Z")),
            // Years: a bound, the last year, and increments counted from 1970.
            ("cron(0 0 1 JAN ? 2027)", "UTC", "2026-06-01T00:00:00Z", Some("2027-01-01T00:00:00Z")),
            ("cron(0 0 1 JAN ? 2027)", "UTC", "2027-01-01T00:00:00Z", none),
            (
                "cron(59 23 31 DEC ? 2199)",
                "UTC",
                "2199-01-01T00:00:00Z",
                Some("2199-12-31T23:59:00Z"),
            ),
            ("cron(59 23 31 DEC ? 2199)", "UTC", "2199-12-31T23:59:00Z", none),
            ("cron(0 0 * * ? *)", "UTC", "2199-12-31T00:00:00Z", none),
            ("cron(0 0 1 1 ? */4)", "UTC", "2025-06-01T00:00:00Z", Some("2026-01-01T00:00:00Z")),
            ("cron(0 0 1 1 ? */4)", "UTC", "2026-06-01T00:00:00Z", Some("2030-01-01T00:00:00Z")),
            ("cron(0 0 1 1 ? 2027/2)", "UTC", "2027-06-01T00:00:00Z", Some("2029-01-01T00:00:00Z")),
            // Read in the time zone's wall-clock time.
            (
                "cron(0 9 * * ? *)",
                "Europe/Berlin",
                "2026-01-15T00:00:00Z",
                Some("2026-01-15T08:00:00Z"),
            ),
            (
                "cron(0 9 * * ? *)",
                "Europe/Berlin",
                "2026-07-15T00:00:00Z",
                Some("2026-07-15T07:00:00Z"),
            ),
            (
                "cron(0 9 * * ? *)",
                "Asia/Kolkata",
                "2026-01-15T00:00:00Z",
                Some("2026-01-15T03:30:00Z"),
            ),
            // The local date decides the day: 23:30 in New York is the next day in UTC.
            (
                "cron(30 23 ? * FRI *)",
                "America/New_York",
                "2026-01-01T00:00:00Z",
                Some("2026-01-03T04:30:00Z"),
            ),
        ] {
            let next = expr(expression).next_after(t(after), &zone(tz), t("2000-01-01T00:00:00Z"));
            assert_eq!(next, expected.map(t), "{expression} in {tz} after {after}");
        }
    }

    /// EventBridge's weekdays are 1–7 from Sunday, the names their aliases (croner's own
    /// numbering is 0–6: the translation is what makes 1 Sunday).
    #[test]
    fn weekday_numbers_and_names_are_sunday_to_saturday() {
        let names = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];
        let after = t("2026-01-01T00:00:00Z");
        for (index, name) in names.iter().enumerate() {
            let number = index + 1;
            let by_number = expr(&format!("cron(0 10 ? * {number} *)"));
            let by_name = expr(&format!("cron(0 10 ? * {name} *)"));
            let next = by_number.next_after(after, &ScheduleTimeZone::UTC, after).unwrap();
            assert_eq!(by_name.next_after(after, &ScheduleTimeZone::UTC, after), Some(next));
            assert_eq!(next.weekday().num_days_from_sunday() as usize, index, "{name}");
            assert_eq!(next.format("%a").to_string().to_uppercase(), *name);
        }
    }

    /// Fire times of `expression` in `tz` during one local day.
    fn fires_on_local_day(expression: &str, tz: &str, day: &str) -> Vec<DateTime<Utc>> {
        let date = NaiveDate::parse_from_str(day, "%Y-%m-%d").unwrap();
        let midnight = |d: NaiveDate| {
            zone(tz).tz().from_local_datetime(&d.and_hms_opt(0, 0, 0).unwrap()).single().unwrap()
        };
        let (from, until) = (midnight(date).to_utc(), midnight(date.succ_opt().unwrap()).to_utc());
        let fires = open(expression, tz).fires_between(from, until, MAX_LISTED_FIRES);
        assert!(!fires.more);
        fires.times
    }

    #[test]
    fn a_time_skipped_in_spring_does_not_fire() {
        // New York, 8 March 2026: 02:00 EST becomes 03:00 EDT; 02:30 does not exist.
        let daily = open("cron(30 2 * * ? *)", "America/New_York");
        assert_eq!(daily.next_after(t("2026-03-07T07:00:00Z")), Some(t("2026-03-07T07:30:00Z")));
        assert_eq!(
            daily.next_after(t("2026-03-07T07:30:00Z")),
            Some(t("2026-03-09T06:30:00Z")),
            "nothing on the 8th, not even at 03:00 or 03:30"
        );
        assert!(
            fires_on_local_day("cron(30 2 * * ? *)", "America/New_York", "2026-03-08").is_empty()
        );

        // Berlin, 29 March 2026: 02:00 CET becomes 03:00 CEST.
        let daily = open("cron(30 2 * * ? *)", "Europe/Berlin");
        assert_eq!(daily.next_after(t("2026-03-28T01:30:00Z")), Some(t("2026-03-30T00:30:00Z")));
        assert!(fires_on_local_day("cron(30 2 * * ? *)", "Europe/Berlin", "2026-03-29").is_empty());
    }

    #[test]
    fn a_time_repeated_in_autumn_fires_once_at_its_first_instant() {
        // New York, 1 November 2026: 02:00 EDT becomes 01:00 EST; 01:30 happens at 05:30Z
        // (EDT) and again at 06:30Z (EST).
        let daily = open("cron(30 1 * * ? *)", "America/New_York");
        assert_eq!(daily.next_after(t("2026-11-01T04:00:00Z")), Some(t("2026-11-01T05:30:00Z")));
        assert_eq!(daily.next_after(t("2026-11-01T05:30:00Z")), Some(t("2026-11-02T06:30:00Z")));
        // From inside the repeated hour's second pass, the second 01:30 is not a fire either.
        assert_eq!(daily.next_after(t("2026-11-01T06:00:00Z")), Some(t("2026-11-02T06:30:00Z")));
        assert_eq!(
            fires_on_local_day("cron(30 1 * * ? *)", "America/New_York", "2026-11-01"),
            vec![t("2026-11-01T05:30:00Z")]
        );

        // Berlin, 25 October 2026: 03:00 CEST becomes 02:00 CET; 02:30 is at 00:30Z and 01:30Z.
        let daily = open("cron(30 2 * * ? *)", "Europe/Berlin");
        assert_eq!(daily.next_after(t("2026-10-25T00:00:00Z")), Some(t("2026-10-25T00:30:00Z")));
        assert_eq!(daily.next_after(t("2026-10-25T00:30:00Z")), Some(t("2026-10-26T01:30:00Z")));
        assert_eq!(
            fires_on_local_day("cron(30 2 * * ? *)", "Europe/Berlin", "2026-10-25"),
            vec![t("2026-10-25T00:30:00Z")]
        );
    }

    #[test]
    fn hourly_and_quarter_hourly_schedules_across_both_changes() {
        for (tz, spring, autumn) in [
            ("America/New_York", "2026-03-08", "2026-11-01"),
            ("Europe/Berlin", "2026-03-29", "2026-10-25"),
        ] {
            // A 23-hour day has 23 hourly fires, a 25-hour day 24 (its repeated hour once).
            assert_eq!(fires_on_local_day("cron(0 * * * ? *)", tz, spring).len(), 23, "{tz}");
            assert_eq!(fires_on_local_day("cron(0 * * * ? *)", tz, autumn).len(), 24, "{tz}");
            assert_eq!(fires_on_local_day("cron(0/15 * * * ? *)", tz, spring).len(), 92, "{tz}");
            assert_eq!(fires_on_local_day("cron(0/15 * * * ? *)", tz, autumn).len(), 96, "{tz}");
            // An ordinary day, for contrast.
            assert_eq!(fires_on_local_day("cron(0 * * * ? *)", tz, "2026-06-10").len(), 24);
        }
        // Which instants: in New York's autumn the 01:00 hour fires in its first pass (EDT,
        // 05:00Z) and not its second (EST, 06:00Z); 01:xx EDT is followed by 02:00 EST.
        let autumn = fires_on_local_day("cron(0/15 * * * ? *)", "America/New_York", "2026-11-01");
        let around: Vec<_> = autumn
            .iter()
            .filter(|at| (t("2026-11-01T05:00:00Z")..=t("2026-11-01T07:00:00Z")).contains(*at))
            .copied()
            .collect();
        assert_eq!(
            around,
            ["05:00", "05:15", "05:30", "05:45", "07:00"]
                .map(|hm| t(&format!("2026-11-01T{hm}:00Z")))
        );
        // And in spring, 01:45 EST (06:45Z) is followed by 03:00 EDT (07:00Z).
        let spring = fires_on_local_day("cron(0/15 * * * ? *)", "America/New_York", "2026-03-08");
        let i = spring.iter().position(|at| *at == t("2026-03-08T06:45:00Z")).unwrap();
        assert_eq!(spring[i + 1], t("2026-03-08T07:00:00Z"));
        assert_eq!(
            spring[i + 1].with_timezone(&zone("America/New_York").tz()).format("%H:%M").to_string(),
            "03:00"
        );
    }

    #[test]
    fn a_rate_fires_at_its_anchor_and_every_interval_after() {
        let every_5 = expr("rate(5 minutes)");
        let anchor = t("2026-01-01T10:00:30Z");
        let utc = ScheduleTimeZone::UTC;
        assert_eq!(every_5.next_after(t("2026-01-01T09:00:00Z"), &utc, anchor), Some(anchor));
        assert_eq!(every_5.next_after(anchor, &utc, anchor), Some(t("2026-01-01T10:05:30Z")));
        assert_eq!(
            every_5.next_after(t("2026-01-01T10:03:00Z"), &utc, anchor),
            Some(t("2026-01-01T10:05:30Z"))
        );
        assert_eq!(
            every_5.next_after(t("2026-01-01T10:05:29.999Z"), &utc, anchor),
            Some(t("2026-01-01T10:05:30Z"))
        );
        assert_eq!(
            every_5.next_after(t("2026-01-08T10:05:30Z"), &utc, anchor),
            Some(t("2026-01-08T10:10:30Z")),
            "a week on, still on the anchor's grid"
        );

        // Without start_at a rate starts at its creation, at once; with one, at start_at.
        let created = t("2026-01-01T10:00:30Z");
        let recurrence = Recurrence::new(every_5.clone(), utc, created, None, None).unwrap();
        assert_eq!(recurrence.anchor(), created);
        assert_eq!(recurrence.next_from(created), Some(created));
        let start = t("2026-02-01T00:00:07Z");
        let recurrence = Recurrence::new(every_5, utc, created, Some(start), None).unwrap();
        assert_eq!(recurrence.anchor(), start);
        assert_eq!(recurrence.next_from(created), Some(start));
        assert_eq!(recurrence.next_after(start), Some(t("2026-02-01T00:05:07Z")));
    }

    #[test]
    fn a_rate_is_real_time_whatever_the_time_zone() {
        // rate(1 day) in New York across the spring change: 24 hours apart, so 07:00 EST is
        // followed by 08:00 EDT.
        let daily = expr("rate(1 day)");
        let anchor = t("2026-03-07T12:00:00Z");
        let new_york = zone("America/New_York");
        let next = daily.next_after(anchor, &new_york, anchor).unwrap();
        assert_eq!(next, t("2026-03-08T12:00:00Z"));
        assert_eq!(next.with_timezone(&new_york.tz()).format("%H:%M").to_string(), "08:00");
        assert_eq!(daily.next_after(anchor, &ScheduleTimeZone::UTC, anchor), Some(next));
    }

    #[test]
    fn the_window_bounds_the_fires_both_ends_included() {
        let created = t("2025-12-01T00:00:00Z");
        let hourly = |start: &str, end: &str| {
            Recurrence::new(
                expr("cron(0 * * * ? *)"),
                ScheduleTimeZone::UTC,
                created,
                Some(t(start)),
                Some(t(end)),
            )
            .unwrap()
        };
        let recurrence = hourly("2026-01-01T10:30:00Z", "2026-01-01T13:00:00Z");
        assert_eq!(
            recurrence.next_after(t("2026-01-01T00:00:00Z")),
            Some(t("2026-01-01T11:00:00Z"))
        );
        assert_eq!(
            recurrence
                .fires_between(t("2026-01-01T00:00:00Z"), t("2026-01-02T00:00:00Z"), 100)
                .times,
            ["11", "12", "13"].map(|h| t(&format!("2026-01-01T{h}:00:00Z")))
        );
        assert_eq!(recurrence.next_after(t("2026-01-01T13:00:00Z")), None);

        // A fire exactly at start_at counts.
        let recurrence = hourly("2026-01-01T11:00:00Z", "2026-01-01T13:00:00Z");
        assert_eq!(
            recurrence.next_after(t("2026-01-01T00:00:00Z")),
            Some(t("2026-01-01T11:00:00Z"))
        );

        for (start, end) in [
            ("2026-01-01T11:00:00Z", "2026-01-01T11:00:00Z"),
            ("2026-01-02T00:00:00Z", "2026-01-01T00:00:00Z"),
        ] {
            let made = Recurrence::new(
                expr("cron(0 * * * ? *)"),
                ScheduleTimeZone::UTC,
                created,
                Some(t(start)),
                Some(t(end)),
            );
            assert_eq!(made, Err(InvalidWindow));
        }
        // One end alone is fine.
        let until = Recurrence::new(
            expr("rate(1 hour)"),
            ScheduleTimeZone::UTC,
            t("2026-01-01T00:00:00Z"),
            None,
            Some(t("2026-01-01T02:30:00Z")),
        )
        .unwrap();
        assert_eq!(
            until.fires_between(t("2025-01-01T00:00:00Z"), t("2027-01-01T00:00:00Z"), 100).times,
            ["00", "01", "02"].map(|h| t(&format!("2026-01-01T{h}:00:00Z")))
        );
    }

    #[test]
    fn fire_lists_are_half_open_and_capped() {
        let every_minute = open("rate(1 minute)", "UTC");
        let from = t("2000-01-01T00:10:00Z");
        // [from, until): a fire at `from` is in, one at `until` out.
        let fires = every_minute.fires_between(from, t("2000-01-01T00:13:00Z"), 100);
        assert_eq!(fires.times, ["10", "11", "12"].map(|m| t(&format!("2000-01-01T00:{m}:00Z"))));
        assert!(!fires.more);
        // Exactly `limit` fires in the range: all listed, none more.
        let fires = every_minute.fires_between(from, t("2000-01-01T00:13:00Z"), 3);
        assert_eq!((fires.times.len(), fires.more), (3, false));
        let fires = every_minute.fires_between(from, t("2000-01-01T00:13:00Z"), 2);
        assert_eq!((fires.times.len(), fires.more), (2, true));
        // A month of minutes is cut at MAX_LISTED_FIRES, whatever the limit asked.
        let fires = every_minute.fires_between(from, t("2000-02-01T00:00:00Z"), usize::MAX);
        assert_eq!((fires.times.len(), fires.more), (MAX_LISTED_FIRES, true));
        assert!(every_minute.fires_between(from, from, 10).times.is_empty());
    }

    #[test]
    fn time_zones_are_iana_names() {
        for name in ["UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata", "US/Eastern"] {
            let parsed = zone(name);
            assert_eq!(parsed.as_str(), name);
            assert_eq!(parsed.to_string(), name);
            let json = serde_json::to_string(&parsed).unwrap();
            assert_eq!(json, format!("\"{name}\""));
            assert_eq!(serde_json::from_str::<ScheduleTimeZone>(&json).unwrap(), parsed);
        }
        assert_eq!(ScheduleTimeZone::default(), zone("UTC"));
        for bad in ["", "Mars/Olympus", "europe/berlin", "+01:00", "CEST", "Europe/Berlin "] {
            assert_eq!(
                bad.parse::<ScheduleTimeZone>(),
                Err(InvalidTimeZone { text: bad.into() }),
                "{bad:?}"
            );
            assert!(serde_json::from_str::<ScheduleTimeZone>(&format!("{bad:?}")).is_err());
        }
        let long = "A".repeat(MAX_TIME_ZONE_LEN + 1);
        assert!(long.parse::<ScheduleTimeZone>().is_err());
        assert_eq!(
            "Mars/Olympus".parse::<ScheduleTimeZone>().unwrap_err().to_string(),
            "unknown time zone \"Mars/Olympus\": give an IANA name such as UTC, Europe/Berlin or \
             America/New_York"
        );
    }

    // ------------------------------------------------------------------------------------
    // Properties: the cron search against a minute-by-minute scan of EventBridge's rule.
    // ------------------------------------------------------------------------------------

    /// The fires EventBridge's documented rule gives in `[from, until)`, found by looking at
    /// every minute: a minute fires when its wall-clock time in `tz` matches the expression
    /// and it is the first instant showing that wall-clock time.
    fn scanned_fires(
        expression: &ScheduleExpression,
        tz: Tz,
        from: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Vec<DateTime<Utc>> {
        let Kind::Cron(cron) = &expression.kind else { panic!("a cron expression") };
        let mut fires = Vec::new();
        let mut minute = from;
        while minute < until {
            let wall = minute.with_timezone(&tz).naive_local();
            let first = tz.from_local_datetime(&wall).earliest().map(|at| at.to_utc());
            if cron.is_time_matching(&wall).unwrap() && first == Some(minute) {
                fires.push(minute);
            }
            minute += TimeDelta::minutes(1);
        }
        fires
    }

    /// Zones to search in, each with the clock changes (UTC) to search around: two
    /// whole-hour ones, Lord Howe's half-hour one, and zones without any.
    const ZONES_AND_CHANGES: [(&str, &str); 8] = [
        ("America/New_York", "2026-03-08T07:00:00Z"),
        ("America/New_York", "2026-11-01T06:00:00Z"),
        ("Europe/Berlin", "2026-03-29T01:00:00Z"),
        ("Europe/Berlin", "2026-10-25T01:00:00Z"),
        ("Australia/Lord_Howe", "2026-04-04T15:00:00Z"),
        ("Australia/Lord_Howe", "2026-10-03T15:30:00Z"),
        ("Asia/Kolkata", "2026-03-08T07:00:00Z"),
        ("UTC", "2026-10-25T01:00:00Z"),
    ];

    fn cron_text() -> impl Strategy<Value = String> {
        let minutes = prop::sample::select(vec!["*", "0", "30", "0/7", "5-50/10", "15,45", "1/20"]);
        let hours = prop::sample::select(vec!["*", "1", "2", "0-3", "1/2", "22-23", "0,2,4"]);
        let days = prop::sample::select(vec![
            "* ?",
            "? *",
            "L ?",
            "15W ?",
            "? 1#2",
            "? 6L",
            "? MON-FRI",
            "? L",
            "LW ?",
            "? 1",
            "1-7 ?",
        ]);
        let months = prop::sample::select(vec!["*", "MAR,APR,OCT,NOV", "1-6"]);
        (minutes, hours, days, months).prop_map(|(m, h, d, mo)| {
            let (dom, dow) = d.split_once(' ').unwrap();
            format!("cron({m} {h} {dom} {mo} {dow} *)")
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn cron_fires_are_the_scanned_fires(
            text in cron_text(),
            (tz, change) in prop::sample::select(ZONES_AND_CHANGES.to_vec()),
            hours_before in 0i64..48,
        ) {
            let expression = expr(&text);
            let reparsed = expr(expression.as_str());
            prop_assert_eq!(reparsed.as_str(), expression.as_str());
            let from = t(change) - TimeDelta::hours(hours_before);
            let until = from + TimeDelta::days(3);
            let recurrence = open(&text, tz);
            let listed = recurrence.fires_between(from, until, MAX_LISTED_FIRES);
            prop_assert!(!listed.more);
            prop_assert_eq!(&listed.times, &scanned_fires(&expression, zone(tz).tz(), from, until));
            // Each is the next after the one before, strictly later.
            for pair in listed.times.windows(2) {
                prop_assert!(pair[0] < pair[1]);
                prop_assert_eq!(recurrence.next_after(pair[0]), Some(pair[1]));
            }
        }

        #[test]
        fn a_rate_fires_on_its_anchor_grid(
            anchor_s in 1_600_000_000i64..1_900_000_000,
            after_offset in -100_000_000i64..100_000_000,
            value in 1u32..1_000,
            unit in prop::sample::select(vec![("minute", 60i64), ("hour", 3_600), ("day", 86_400)]),
        ) {
            let (name, seconds) = unit;
            let text = if value == 1 { format!("rate(1 {name})") } else { format!("rate({value} {name}s)") };
            let anchor = DateTime::from_timestamp(anchor_s, 0).unwrap();
            let after = anchor + TimeDelta::seconds(after_offset) + TimeDelta::milliseconds(after_offset % 1000);
            let every = i64::from(value) * seconds;
            let next = expr(&text).next_after(after, &ScheduleTimeZone::UTC, anchor).unwrap();
            prop_assert!(next > after);
            prop_assert!(next >= anchor);
            prop_assert_eq!((next - anchor).num_seconds() % every, 0);
            prop_assert_eq!((next - anchor).subsec_nanos(), 0);
            // Nothing on the grid was skipped.
            prop_assert!(next == anchor || next - TimeDelta::seconds(every) <= after);
        }
    }
}
