//! `units`: converts a quantity between units of length, mass, time, temperature and digital
//! data. The value may be a number or an arithmetic expression, which this tool evaluates by
//! calling the `calculator` tool through the host (`call_tool`): a small example of composition,
//! where the callee runs in its own sandbox under the same checks and the caller's deadline.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use toolsmith_sdk::{Level, ToolError};

/// A conversion request.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Input {
    /// The quantity: a number, or an arithmetic expression such as `"3 * 12 + 4"`.
    pub value: Quantity,
    /// The unit of `value`, e.g. `km`, `lb`, `h`, `°F`, `MiB`.
    #[schemars(length(min = 1, max = 32))]
    pub from: String,
    /// The unit to convert to, of the same dimension as `from`.
    #[schemars(length(min = 1, max = 32))]
    pub to: String,
}

/// A number or an expression to evaluate.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Quantity {
    /// A plain number.
    Number(f64),
    /// An arithmetic expression, evaluated by the `calculator` tool.
    Expression(String),
}

/// The converted quantity.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Output {
    /// The value in the `to` unit.
    pub value: f64,
    /// The canonical symbol of the source unit.
    pub from: String,
    /// The canonical symbol of the target unit.
    pub to: String,
    /// `length`, `mass`, `time`, `temperature` or `data`.
    pub dimension: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dimension {
    Length,
    Mass,
    Time,
    Temperature,
    Data,
}

impl Dimension {
    fn name(self) -> &'static str {
        match self {
            Dimension::Length => "length",
            Dimension::Mass => "mass",
            Dimension::Time => "time",
            Dimension::Temperature => "temperature",
            Dimension::Data => "data",
        }
    }
}

/// A unit: `base = value * scale + offset` in the dimension's base unit (m, kg, s, K, bit).
struct Unit {
    symbol: &'static str,
    aliases: &'static [&'static str],
    dimension: Dimension,
    scale: f64,
    offset: f64,
}

const fn unit(symbol: &'static str, aliases: &'static [&'static str], dimension: Dimension, scale: f64) -> Unit {
    Unit { symbol, aliases, dimension, scale, offset: 0.0 }
}

use Dimension::*;

const UNITS: &[Unit] = &[
    unit("m", &["meter", "meters", "metre", "metres"], Length, 1.0),
    unit("km", &["kilometer", "kilometers", "kilometre", "kilometres"], Length, 1e3),
    unit("cm", &["centimeter", "centimeters", "centimetre", "centimetres"], Length, 1e-2),
    unit("mm", &["millimeter", "millimeters", "millimetre", "millimetres"], Length, 1e-3),
    unit("µm", &["um", "micrometer", "micrometers", "micron", "microns"], Length, 1e-6),
    unit("nm", &["nanometer", "nanometers", "nanometre", "nanometres"], Length, 1e-9),
    unit("in", &["inch", "inches", "\""], Length, 0.0254),
    unit("ft", &["foot", "feet", "'"], Length, 0.3048),
    unit("yd", &["yard", "yards"], Length, 0.9144),
    unit("mi", &["mile", "miles"], Length, 1609.344),
    unit("nmi", &["nautical_mile", "nautical miles", "nautical mile"], Length, 1852.0),
    unit("kg", &["kilogram", "kilograms", "kilo", "kilos"], Mass, 1.0),
    unit("g", &["gram", "grams"], Mass, 1e-3),
    unit("mg", &["milligram", "milligrams"], Mass, 1e-6),
    unit("µg", &["ug", "microgram", "micrograms"], Mass, 1e-9),
    unit("t", &["tonne", "tonnes", "metric ton", "metric tons"], Mass, 1e3),
    unit("lb", &["lbs", "pound", "pounds"], Mass, 0.453_592_37),
    unit("oz", &["ounce", "ounces"], Mass, 0.028_349_523_125),
    unit("st", &["stone", "stones"], Mass, 6.350_293_18),
    unit("ns", &["nanosecond", "nanoseconds"], Time, 1e-9),
    unit("µs", &["us", "microsecond", "microseconds"], Time, 1e-6),
    unit("ms", &["millisecond", "milliseconds"], Time, 1e-3),
    unit("s", &["sec", "secs", "second", "seconds"], Time, 1.0),
    unit("min", &["mins", "minute", "minutes"], Time, 60.0),
    unit("h", &["hr", "hrs", "hour", "hours"], Time, 3600.0),
    unit("d", &["day", "days"], Time, 86_400.0),
    unit("wk", &["week", "weeks"], Time, 604_800.0),
    unit("yr", &["year", "years"], Time, 31_557_600.0), // Julian year: 365.25 days
    Unit { symbol: "K", aliases: &["kelvin", "kelvins"], dimension: Temperature, scale: 1.0, offset: 0.0 },
    Unit {
        symbol: "°C",
        aliases: &["C", "degC", "celsius", "centigrade"],
        dimension: Temperature,
        scale: 1.0,
        offset: 273.15,
    },
    Unit {
        symbol: "°F",
        aliases: &["F", "degF", "fahrenheit"],
        dimension: Temperature,
        scale: 5.0 / 9.0,
        offset: 273.15 - 32.0 * 5.0 / 9.0,
    },
    Unit { symbol: "°R", aliases: &["R", "degR", "rankine"], dimension: Temperature, scale: 5.0 / 9.0, offset: 0.0 },
    unit("bit", &["bits", "b"], Data, 1.0),
    unit("B", &["byte", "bytes"], Data, 8.0),
    unit("kB", &["KB", "kilobyte", "kilobytes"], Data, 8e3),
    unit("MB", &["megabyte", "megabytes"], Data, 8e6),
    unit("GB", &["gigabyte", "gigabytes"], Data, 8e9),
    unit("TB", &["terabyte", "terabytes"], Data, 8e12),
    unit("PB", &["petabyte", "petabytes"], Data, 8e15),
    unit("KiB", &["kibibyte", "kibibytes"], Data, 8.0 * 1024.0),
    unit("MiB", &["mebibyte", "mebibytes"], Data, 8.0 * 1048576.0),
    unit("GiB", &["gibibyte", "gibibytes"], Data, 8.0 * 1073741824.0),
    unit("TiB", &["tebibyte", "tebibytes"], Data, 8.0 * 1099511627776.0),
    unit("kbit", &["kb", "kilobit", "kilobits"], Data, 1e3),
    unit("Mbit", &["Mb", "megabit", "megabits"], Data, 1e6),
    unit("Gbit", &["Gb", "gigabit", "gigabits"], Data, 1e9),
];

/// Symbols match exactly (`MB` is not `mb`); long names also match case-insensitively.
fn lookup(name: &str) -> Result<&'static Unit, ToolError> {
    let name = name.trim();
    let exact = UNITS.iter().find(|u| u.symbol == name || u.aliases.contains(&name));
    let loose = || UNITS.iter().find(|u| u.aliases.iter().any(|a| a.len() > 3 && a.eq_ignore_ascii_case(name)));
    exact.or_else(loose).ok_or_else(|| {
        let known: Vec<&str> = UNITS.iter().map(|u| u.symbol).collect();
        ToolError::new("unknown_unit", format!("unknown unit `{name}`; known units: {}", known.join(", ")))
    })
}

/// Converts `input.value` from `input.from` to `input.to`.
pub fn convert(input: Input) -> Result<Output, ToolError> {
    let from = lookup(&input.from)?;
    let to = lookup(&input.to)?;
    if from.dimension != to.dimension {
        return Err(ToolError::new(
            "incompatible_units",
            format!(
                "cannot convert {} ({}) to {} ({})",
                from.symbol,
                from.dimension.name(),
                to.symbol,
                to.dimension.name()
            ),
        ));
    }
    let value = match input.value {
        Quantity::Number(v) => v,
        Quantity::Expression(expression) => {
            toolsmith_sdk::log(Level::Debug, &format!("evaluating `{expression}` with calculator"));
            let out = toolsmith_sdk::call_tool("calculator", &json!({ "expression": expression }))?;
            out["value"]
                .as_f64()
                .ok_or_else(|| ToolError::new("invalid_output", format!("calculator returned no number: {out}")))?
        }
    };
    let base = value * from.scale + from.offset;
    if from.dimension == Temperature && base < 0.0 {
        return Err(ToolError::new("below_absolute_zero", format!("{value} {} is below absolute zero", from.symbol)));
    }
    let converted = (base - to.offset) / to.scale;
    Ok(Output {
        value: round_sig(converted),
        from: from.symbol.to_owned(),
        to: to.symbol.to_owned(),
        dimension: from.dimension.name().to_owned(),
    })
}

/// Rounds to 12 significant digits so `1 in -> cm` prints 2.54, not 2.5400000000000005.
fn round_sig(v: f64) -> f64 {
    if v == 0.0 || !v.is_finite() {
        return v;
    }
    let digits = 12 - (v.abs().log10().floor() as i32) - 1;
    let factor = 10f64.powi(digits.clamp(-300, 300));
    let rounded = (v * factor).round() / factor;
    if rounded.is_finite() { rounded } else { v }
}

toolsmith_sdk::tool! {
    name: "units",
    description: "Converts a quantity between units of length (m, km, mi, ft, in, ...), mass (kg, \
                  g, lb, oz, ...), time (s, min, h, d, yr, ...), temperature (°C, °F, K) and \
                  digital data (bit, B, kB, MB, KiB, MiB, ...). The value may be an arithmetic \
                  expression, evaluated with the calculator tool.",
    run: convert,
    examples: [
        {"value": 5, "from": "km", "to": "mi"}
            => {"value": 3.10685596119, "from": "km", "to": "mi", "dimension": "length"},
        {"value": 100, "from": "°C", "to": "°F"}
            => {"value": 212.0, "from": "°C", "to": "°F", "dimension": "temperature"},
        {"value": "3 * 512", "from": "MiB", "to": "GiB"}
            => {"value": 1.5, "from": "MiB", "to": "GiB", "dimension": "data"},
    ],
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conv(v: f64, from: &str, to: &str) -> f64 {
        convert(Input { value: Quantity::Number(v), from: from.into(), to: to.into() }).expect("conversion").value
    }

    #[test]
    fn conversions() {
        assert_eq!(conv(1.0, "in", "cm"), 2.54);
        assert_eq!(conv(0.0, "celsius", "K"), 273.15);
        assert_eq!(conv(-40.0, "°F", "°C"), -40.0);
        assert_eq!(conv(1.0, "GiB", "MiB"), 1024.0);
        assert_eq!(conv(90.0, "min", "h"), 1.5);
    }
}
