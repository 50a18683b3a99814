//! `calculator`: evaluates an arithmetic expression with the usual precedence, parentheses,
//! functions and constants. The grammar (`calculator.pest`) is parsed by `pest` and folded with its
//! Pratt parser: `^` binds tighter than unary minus and associates to the right, as in
//! mathematics and Python (`-2^2 = -4`, `2^3^2 = 512`). A crate that evaluates expressions whole
//! (`exmex`) was tried first and rejected: it gets both of those wrong.

use pest::Parser;
use pest::iterators::Pairs;
use pest::pratt_parser::{Assoc, Op, PrattParser};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use toolsmith_sdk::ToolError;

/// An arithmetic expression.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Input {
    /// The expression, e.g. `2 * (3 + 4) ^ 2 / sqrt(16)`. Operators `+ - * / % ^` (also `**`),
    /// parentheses, functions such as `sqrt exp ln log(x, base) sin atan2(y, x) min(a, b, ...)
    /// round`, constants `pi`, `e`, `tau`. Numbers are 64-bit floats (`1.5e3` allowed).
    #[schemars(length(min = 1, max = 4096))]
    pub expression: String,
}

/// The value of the expression.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Output {
    /// The result as a 64-bit float.
    pub value: f64,
}

/// Evaluates `input.expression`.
pub fn calculate(input: Input) -> Result<Output, ToolError> {
    let value = evaluate(&input.expression)?;
    Ok(Output { value })
}

#[derive(pest_derive::Parser)]
#[grammar = "calculator.pest"]
struct Grammar;

/// Deepest parenthesis nesting accepted; deeper input is refused before parsing so no
/// expression can exhaust the stack.
const MAX_NESTING: usize = 64;

fn pratt() -> PrattParser<Rule> {
    PrattParser::new()
        .op(Op::infix(Rule::add, Assoc::Left) | Op::infix(Rule::sub, Assoc::Left))
        .op(Op::infix(Rule::mul, Assoc::Left) | Op::infix(Rule::div, Assoc::Left) | Op::infix(Rule::rem, Assoc::Left))
        .op(Op::prefix(Rule::neg) | Op::prefix(Rule::pos))
        .op(Op::infix(Rule::pow, Assoc::Right))
}

/// Evaluates an expression to a finite number.
pub fn evaluate(expression: &str) -> Result<f64, ToolError> {
    let mut depth = 0usize;
    for c in expression.chars() {
        depth = match c {
            '(' => depth + 1,
            ')' => depth.saturating_sub(1),
            _ => depth,
        };
        if depth > MAX_NESTING {
            return Err(ToolError::new("too_deep", format!("parentheses nest deeper than {MAX_NESTING} levels")));
        }
    }
    let mut pairs = Grammar::parse(Rule::calculation, expression).map_err(|e| {
        let e = e.renamed_rules(|rule| format!("{rule:?}"));
        ToolError::new("invalid_expression", format!("cannot parse `{expression}`:\n{e}"))
    })?;
    let expr = pairs.next().ok_or_else(|| ToolError::new("invalid_expression", "empty expression"))?;
    let value = eval(expr.into_inner(), &pratt())?;
    if value.is_finite() {
        Ok(value)
    } else {
        let what = if value.is_nan() { "not a number" } else { "infinite (division by zero or overflow)" };
        Err(ToolError::new("not_finite", format!("`{expression}` is {what}")))
    }
}

fn eval(pairs: Pairs<'_, Rule>, pratt: &PrattParser<Rule>) -> Result<f64, ToolError> {
    pratt
        .map_primary(|p| match p.as_rule() {
            Rule::number => p
                .as_str()
                .parse::<f64>()
                .map_err(|e| ToolError::new("invalid_number", format!("`{}`: {e}", p.as_str()))),
            Rule::expr => eval(p.into_inner(), pratt),
            Rule::name => constant(p.as_str()),
            Rule::call => {
                let mut inner = p.into_inner();
                let name = inner.next().map(|n| n.as_str()).unwrap_or_default();
                let args = inner.map(|a| eval(a.into_inner(), pratt)).collect::<Result<Vec<f64>, _>>()?;
                function(name, &args)
            }
            rule => Err(ToolError::new("invalid_expression", format!("unexpected {rule:?}"))),
        })
        .map_prefix(|op, rhs| match op.as_rule() {
            Rule::neg => Ok(-rhs?),
            _ => rhs,
        })
        .map_infix(|lhs, op, rhs| {
            let (a, b) = (lhs?, rhs?);
            Ok(match op.as_rule() {
                Rule::add => a + b,
                Rule::sub => a - b,
                Rule::mul => a * b,
                Rule::div => a / b,
                Rule::rem => a % b,
                _ => a.powf(b),
            })
        })
        .parse(pairs)
}

fn constant(name: &str) -> Result<f64, ToolError> {
    use std::f64::consts;
    Ok(match name.to_ascii_lowercase().as_str() {
        "pi" | "π" => consts::PI,
        "e" => consts::E,
        "tau" | "τ" => consts::TAU,
        _ => {
            return Err(ToolError::new(
                "unknown_name",
                format!("`{name}` is not a constant (constants: pi, e, tau); variables are not supported"),
            ));
        }
    })
}

fn function(name: &str, args: &[f64]) -> Result<f64, ToolError> {
    let lower = name.to_ascii_lowercase();
    let unary = |f: fn(f64) -> f64| match args {
        [x] => Ok(f(*x)),
        _ => Err(arity(name, "1", args.len())),
    };
    match lower.as_str() {
        "sqrt" => unary(f64::sqrt),
        "cbrt" => unary(f64::cbrt),
        "exp" => unary(f64::exp),
        "ln" => unary(f64::ln),
        "log10" => unary(f64::log10),
        "log2" => unary(f64::log2),
        "abs" => unary(f64::abs),
        "floor" => unary(f64::floor),
        "ceil" => unary(f64::ceil),
        "round" => unary(f64::round),
        "trunc" => unary(f64::trunc),
        "sign" | "signum" => unary(f64::signum),
        "sin" => unary(f64::sin),
        "cos" => unary(f64::cos),
        "tan" => unary(f64::tan),
        "asin" => unary(f64::asin),
        "acos" => unary(f64::acos),
        "atan" => unary(f64::atan),
        "sinh" => unary(f64::sinh),
        "cosh" => unary(f64::cosh),
        "tanh" => unary(f64::tanh),
        "degrees" => unary(f64::to_degrees),
        "radians" => unary(f64::to_radians),
        "log" => match args {
            [x] => Ok(x.ln()),
            [x, base] => Ok(x.log(*base)),
            _ => Err(arity(name, "1 or 2", args.len())),
        },
        "pow" | "atan2" | "hypot" => match args {
            [a, b] => Ok(match lower.as_str() {
                "pow" => a.powf(*b),
                "atan2" => a.atan2(*b),
                _ => a.hypot(*b),
            }),
            _ => Err(arity(name, "2", args.len())),
        },
        "min" | "max" if !args.is_empty() => {
            let pick = if lower == "min" { f64::min } else { f64::max };
            Ok(args.iter().copied().fold(args[0], pick))
        }
        "min" | "max" => Err(arity(name, "at least 1", 0)),
        _ => Err(ToolError::new(
            "unknown_function",
            format!(
                "`{name}` is not a function; functions: sqrt cbrt exp ln log log10 log2 abs floor ceil round trunc \
                 sign sin cos tan asin acos atan atan2 sinh cosh tanh hypot pow min max degrees radians"
            ),
        )),
    }
}

fn arity(name: &str, expected: &str, got: usize) -> ToolError {
    ToolError::new("wrong_arity", format!("`{name}` takes {expected} argument(s), got {got}"))
}

toolsmith_sdk::tool! {
    name: "calculator",
    description: "Evaluates an arithmetic expression with operator precedence, parentheses, functions \
                  (sqrt, exp, ln, log, sin, atan2, min, max, round, ...) and constants (pi, e, tau), \
                  and returns its value as a number.",
    run: calculate,
    examples: [
        {"expression": "2 * (3 + 4) ^ 2 / sqrt(16)"} => {"value": 24.5},
        {"expression": "1.5e3 - 10 / 4 * -2"} => {"value": 1505.0},
        {"expression": "round(e ^ 2 * 100) / 100"} => {"value": 7.39},
        {"expression": "-2 ^ 2 + 2 ^ 3 ^ 2"} => {"value": 508.0},
    ],
}

#[cfg(test)]
mod tests {
    use super::evaluate;

    #[test]
    fn precedence_and_associativity() {
        assert_eq!(evaluate("1 + 2 * 3").ok(), Some(7.0));
        assert_eq!(evaluate("2 ^ 3 ^ 2").ok(), Some(512.0));
        assert_eq!(evaluate("-2 ^ 2").ok(), Some(-4.0));
        assert_eq!(evaluate("2 ^ -1").ok(), Some(0.5));
        assert_eq!(evaluate("10 - 4 - 3").ok(), Some(3.0));
        assert_eq!(evaluate("2 ** 10 % 1000").ok(), Some(24.0));
        assert_eq!(evaluate("max(1, 7, 3) + log(8, 2)").ok(), Some(10.0));
    }

    #[test]
    fn errors() {
        assert_eq!(evaluate("1 +").map_err(|e| e.code).err().as_deref(), Some("invalid_expression"));
        assert_eq!(evaluate("foo(1)").map_err(|e| e.code).err().as_deref(), Some("unknown_function"));
        assert_eq!(evaluate("x").map_err(|e| e.code).err().as_deref(), Some("unknown_name"));
        assert_eq!(evaluate("1/0").map_err(|e| e.code).err().as_deref(), Some("not_finite"));
        let deep = format!("{}1{}", "(".repeat(1000), ")".repeat(1000));
        assert_eq!(evaluate(&deep).map_err(|e| e.code).err().as_deref(), Some("too_deep"));
    }
}
