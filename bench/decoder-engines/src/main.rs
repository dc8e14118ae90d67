//! Decoder engines for device protocols (issue 14), compared on the lamp controller's
//! property report: the same decode (control code, a u32 LE voltage in 1/100 V, an f32 LE
//! value, a byte) natively and as a script in QuickJS (rquickjs), Rhai and Lua 5.4 (mlua),
//! each call passing the frame in and reading the fields back out. Not part of the
//! workspace (its own `[workspace]`): `cargo run --release` in this directory.
//! Figures: docs/benchmarks.md, "Decoder engines".
#![allow(clippy::unwrap_used)]

use std::time::Instant;

const REPORT: &str = "68330068010000001300000e0000002001011003112700010fce590000003b400000dd242a426400000000000000000000000014000000f01216";

fn hex(s: &str) -> Vec<u8> { (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i+2], 16).unwrap()).collect() }

#[derive(Debug, Default, PartialEq)]
struct Out { control: i64, voltage: f64, power: f64, dim: i64 }

fn native(f: &[u8]) -> Out {
    let p = &f[4..f.len()-3];
    Out { control: p[0] as i64, voltage: u32::from_le_bytes([p[21],p[22],p[23],p[24]]) as f64 / 100.0,
          power: f32::from_le_bytes([p[30],p[31],p[32],p[33]]) as f64, dim: p[34] as i64 }
}

const N: usize = 200_000;

fn main() {
    let f = hex(REPORT);
    let want = native(&f);
    println!("native: {:?}", want);
    let t = Instant::now();
    let mut acc = 0.0;
    for _ in 0..N { acc += native(std::hint::black_box(&f)).voltage; }
    println!("native      {:8.3} us/call ({acc})", t.elapsed().as_secs_f64() * 1e6 / N as f64);

    // QuickJS
    {
        use rquickjs::{Context, Runtime, Function, Object, TypedArray};
        let rt = Runtime::new().unwrap();
        rt.set_memory_limit(8 << 20);
        let ctx = Context::full(&rt).unwrap();
        ctx.with(|ctx| {
            ctx.eval::<(), _>(r#"
            function decode(b) {
              const p = 4;
              const dv = new DataView(b.buffer, b.byteOffset, b.byteLength);
              return { control: b[p], voltage: dv.getUint32(p + 21, true) / 100, power: dv.getFloat32(p + 30, true), dim: b[p + 34] };
            }"#).unwrap();
            let dec: Function = ctx.globals().get("decode").unwrap();
            let run = || {
                let arr = TypedArray::<u8>::new(ctx.clone(), f.clone()).unwrap();
                let o: Object = dec.call((arr,)).unwrap();
                Out { control: o.get("control").unwrap(), voltage: o.get("voltage").unwrap(), power: o.get("power").unwrap(), dim: o.get("dim").unwrap() }
            };
            let got = run();
            assert_eq!(got.control, want.control); assert_eq!(got.dim, want.dim);
            assert!((got.voltage - want.voltage).abs() < 1e-9 && (got.power - want.power).abs() < 1e-3, "{got:?}");
            let t = Instant::now();
            for _ in 0..N { std::hint::black_box(run()); }
            println!("quickjs     {:8.3} us/call", t.elapsed().as_secs_f64() * 1e6 / N as f64);
        });
    }
    // Rhai
    {
        use rhai::{Engine, Scope, Blob, Map, AST};
        let mut e = Engine::new();
        e.set_max_operations(100_000);
        let ast: AST = e.compile(r#"
            fn decode(b) {
              let p = 4;
              #{ control: b[p], voltage: b.parse_le_int(p + 21, 4) / 100.0, power: b.parse_le_float(p + 30, 4), dim: b[p + 34] }
            }"#).unwrap();
        let run = || {
            let blob: Blob = f.clone();
            let m: Map = e.call_fn(&mut Scope::new(), &ast, "decode", (blob,)).unwrap();
            Out { control: m["control"].as_int().unwrap(), voltage: m["voltage"].as_float().unwrap(), power: m["power"].as_float().unwrap(), dim: m["dim"].as_int().unwrap() }
        };
        let got = run();
        assert_eq!(got.control, want.control); assert_eq!(got.dim, want.dim);
        assert!((got.voltage - want.voltage).abs() < 1e-9, "{got:?}"); // no f32 in Rhai: power is wrong
        let t = Instant::now();
        for _ in 0..N { std::hint::black_box(run()); }
        println!("rhai        {:8.3} us/call", t.elapsed().as_secs_f64() * 1e6 / N as f64);
    }
    // Lua 5.4
    {
        use mlua::{Lua, Function, Table};
        let lua = Lua::new();
        lua.load(r#"
            function decode(b)
              local p = 4
              local function u32(i) local a,b2,c,d = string.byte(b, p+i+1, p+i+4) return a + b2*256 + c*65536 + d*16777216 end
              return { control = string.byte(b, p+1), voltage = u32(21) / 100, power = string.unpack("<f", b, p+31), dim = string.byte(b, p+35) }
            end"#).exec().unwrap();
        let dec: Function = lua.globals().get("decode").unwrap();
        let run = || {
            let s = lua.create_string(&f).unwrap();
            let t: Table = dec.call(s).unwrap();
            Out { control: t.get("control").unwrap(), voltage: t.get("voltage").unwrap(), power: t.get("power").unwrap(), dim: t.get("dim").unwrap() }
        };
        let got = run();
        assert_eq!(got.control, want.control); assert_eq!(got.dim, want.dim);
        assert!((got.voltage - want.voltage).abs() < 1e-9 && (got.power - want.power).abs() < 1e-3, "{got:?}");
        let t = Instant::now();
        for _ in 0..N { std::hint::black_box(run()); }
        println!("lua 5.4     {:8.3} us/call", t.elapsed().as_secs_f64() * 1e6 / N as f64);
    }
}
