//! The arithmetic commands: `expr` (integers over separate arguments) and
//! `calc` (one floating-point expression, parsed by the `calc` module).

use std::io;

use super::Io;

/// `expr`: integer arithmetic and comparisons over separate arguments.
pub(super) fn expr(io: &mut Io, args: &[String]) -> io::Result<i32> {
    fn prec(op: &str) -> Option<u8> {
        Some(match op {
            "|" => 1,
            "&" => 2,
            "=" | "!=" | "<" | ">" | "<=" | ">=" => 3,
            "+" | "-" => 4,
            "*" | "/" | "%" => 5,
            _ => return None,
        })
    }
    fn apply(op: &str, a: &str, b: &str) -> Result<String, &'static str> {
        let (x, y) = (a.parse::<i64>().ok(), b.parse::<i64>().ok());
        let num = |f: fn(i64, i64) -> Option<i64>| match (x, y) {
            (Some(x), Some(y)) => f(x, y).map(|v| v.to_string()).ok_or("arithmetic error"),
            _ => Err("non-integer argument"),
        };
        let truthy = |s: &str| !(s.is_empty() || s == "0");
        let cmp = |o: std::cmp::Ordering| -> String {
            let r = match op {
                "=" => o.is_eq(),
                "!=" => !o.is_eq(),
                "<" => o.is_lt(),
                ">" => o.is_gt(),
                "<=" => o.is_le(),
                _ => o.is_ge(),
            };
            if r { "1" } else { "0" }.to_string()
        };
        match op {
            "+" => num(i64::checked_add),
            "-" => num(i64::checked_sub),
            "*" => num(i64::checked_mul),
            "/" => num(i64::checked_div).map_err(|e| {
                if e == "arithmetic error" {
                    "division by zero"
                } else {
                    e
                }
            }),
            "%" => num(i64::checked_rem).map_err(|e| {
                if e == "arithmetic error" {
                    "division by zero"
                } else {
                    e
                }
            }),
            "|" => Ok(if truthy(a) {
                a.to_string()
            } else if truthy(b) {
                b.to_string()
            } else {
                "0".into()
            }),
            "&" => Ok(if truthy(a) && truthy(b) {
                a.to_string()
            } else {
                "0".into()
            }),
            _ => Ok(match (x, y) {
                (Some(x), Some(y)) => cmp(x.cmp(&y)),
                _ => cmp(a.cmp(b)),
            }),
        }
    }
    // Shunting-yard over the argument list.
    let mut vals: Vec<String> = Vec::new();
    let mut ops: Vec<String> = Vec::new();
    let reduce = |vals: &mut Vec<String>, ops: &mut Vec<String>| -> Result<(), &'static str> {
        let op = ops.pop().ok_or("syntax error")?;
        let b = vals.pop().ok_or("syntax error")?;
        let a = vals.pop().ok_or("syntax error")?;
        vals.push(apply(&op, &a, &b)?);
        Ok(())
    };
    let mut expect_val = true;
    let mut result: Result<(), &'static str> = Ok(());
    for a in args {
        if a == "(" {
            ops.push(a.clone());
            continue;
        }
        if a == ")" {
            while ops.last().is_some_and(|o| o != "(") {
                if let Err(e) = reduce(&mut vals, &mut ops) {
                    result = Err(e);
                }
            }
            if ops.pop().is_none() {
                result = Err("syntax error");
            }
            continue;
        }
        match (expect_val, prec(a)) {
            (false, Some(p)) => {
                while ops.last().and_then(|o| prec(o)).is_some_and(|q| q >= p) {
                    if let Err(e) = reduce(&mut vals, &mut ops) {
                        result = Err(e);
                        break;
                    }
                }
                ops.push(a.clone());
                expect_val = true;
            }
            (true, _) => {
                vals.push(a.clone());
                expect_val = false;
            }
            (false, None) => result = Err("syntax error"),
        }
        if result.is_err() {
            break;
        }
    }
    while result.is_ok() && !ops.is_empty() {
        result = reduce(&mut vals, &mut ops);
    }
    match (result, vals.as_slice()) {
        (Ok(()), [v]) => {
            writeln!(io.out, "{v}")?;
            Ok(if v.is_empty() || v == "0" { 1 } else { 0 })
        }
        (Err(e), _) => {
            io.err(e);
            Ok(2)
        }
        _ => {
            io.err("syntax error");
            Ok(2)
        }
    }
}

/// `calc`: a calculator over one expression: `+ - * / % ^`, parentheses,
/// unary minus, decimals, and `sqrt abs floor ceil round min max`.
pub(super) fn calc_cmd(io: &mut Io, args: &[String]) -> io::Result<i32> {
    let src = args.join(" ");
    if src.trim().is_empty() {
        return io.usage("calc EXPRESSION   e.g. calc '(2 + 3) * 4 / 3'");
    }
    match calc::eval(&src) {
        Ok(v) => {
            writeln!(io.out, "{}", calc::fmt(v))?;
            Ok(0)
        }
        Err(e) => {
            io.err(e);
            Ok(2)
        }
    }
}

mod calc {
    pub fn fmt(v: f64) -> String {
        if v.fract() == 0.0 && v.abs() < 1e15 {
            format!("{}", v as i64)
        } else {
            let s = format!("{v:.10}");
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        }
    }

    pub fn eval(s: &str) -> Result<f64, String> {
        let toks: Vec<char> = s.chars().filter(|c| !c.is_whitespace()).collect();
        let mut p = P {
            t: toks,
            i: 0,
            depth: 0,
        };
        let v = p.sum()?;
        if p.i != p.t.len() {
            return Err(format!("unexpected '{}'", p.t[p.i]));
        }
        if !v.is_finite() {
            return Err("result is not a finite number (division by zero?)".into());
        }
        Ok(v)
    }

    struct P {
        t: Vec<char>,
        i: usize,
        depth: usize,
    }

    impl P {
        fn peek(&self) -> Option<char> {
            self.t.get(self.i).copied()
        }
        fn sum(&mut self) -> Result<f64, String> {
            let mut v = self.product()?;
            while let Some(c @ ('+' | '-')) = self.peek() {
                self.i += 1;
                let r = self.product()?;
                v = if c == '+' { v + r } else { v - r };
            }
            Ok(v)
        }
        fn product(&mut self) -> Result<f64, String> {
            let mut v = self.power()?;
            while let Some(c @ ('*' | '/' | '%')) = self.peek() {
                self.i += 1;
                let r = self.power()?;
                v = match c {
                    '*' => v * r,
                    '/' => v / r,
                    _ => v % r,
                };
            }
            Ok(v)
        }
        fn power(&mut self) -> Result<f64, String> {
            let b = self.unary()?;
            if self.peek() == Some('^') {
                self.i += 1;
                let e = self.power()?;
                return Ok(b.powf(e));
            }
            Ok(b)
        }
        fn unary(&mut self) -> Result<f64, String> {
            match self.peek() {
                Some('-') => {
                    self.i += 1;
                    Ok(-self.unary()?)
                }
                Some('+') => {
                    self.i += 1;
                    self.unary()
                }
                _ => self.atom(),
            }
        }
        fn atom(&mut self) -> Result<f64, String> {
            self.depth += 1;
            if self.depth > 200 {
                return Err("expression nested too deeply".into());
            }
            let r = self.atom_inner();
            self.depth -= 1;
            r
        }
        fn atom_inner(&mut self) -> Result<f64, String> {
            match self.peek() {
                Some('(') => {
                    self.i += 1;
                    let v = self.sum()?;
                    if self.peek() != Some(')') {
                        return Err("missing ')'".into());
                    }
                    self.i += 1;
                    Ok(v)
                }
                Some(c) if c.is_ascii_digit() || c == '.' => {
                    let s = self.i;
                    while self
                        .peek()
                        .is_some_and(|c| c.is_ascii_digit() || c == '.' || c == 'e')
                    {
                        self.i += 1;
                    }
                    let text: String = self.t[s..self.i].iter().collect();
                    text.parse().map_err(|_| format!("bad number '{text}'"))
                }
                Some(c) if c.is_ascii_alphabetic() => {
                    let s = self.i;
                    while self.peek().is_some_and(|c| c.is_ascii_alphabetic()) {
                        self.i += 1;
                    }
                    let name: String = self.t[s..self.i].iter().collect();
                    if name == "pi" {
                        return Ok(std::f64::consts::PI);
                    }
                    if self.peek() != Some('(') {
                        return Err(format!("unknown name '{name}'"));
                    }
                    self.i += 1;
                    let mut argv = vec![self.sum()?];
                    while self.peek() == Some(',') {
                        self.i += 1;
                        argv.push(self.sum()?);
                    }
                    if self.peek() != Some(')') {
                        return Err("missing ')'".into());
                    }
                    self.i += 1;
                    match (name.as_str(), argv.as_slice()) {
                        ("sqrt", [x]) => Ok(x.sqrt()),
                        ("abs", [x]) => Ok(x.abs()),
                        ("floor", [x]) => Ok(x.floor()),
                        ("ceil", [x]) => Ok(x.ceil()),
                        ("round", [x]) => Ok(x.round()),
                        ("min", [x, y]) => Ok(x.min(*y)),
                        ("max", [x, y]) => Ok(x.max(*y)),
                        _ => Err(format!(
                            "unknown function '{name}' or wrong number of arguments"
                        )),
                    }
                }
                Some(c) => Err(format!("unexpected '{c}'")),
                None => Err("unexpected end of expression".into()),
            }
        }
    }
}
