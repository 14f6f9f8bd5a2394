//! A WASI command module pre-initialised: one run of it up to the guest's exit, whose linear
//! memory becomes the data of a new module, so that the next `_start` begins where that run
//! ended instead of redoing its start-up (wizer's idea, taken at the guest's `proc_exit`
//! rather than at an init export, which the module lacks).
//!
//! This holds only for a module whose only global is wasm-ld's stack pointer, which keeps its
//! initial value (no frame is live when `_start` runs again), and whose `_start` runs the
//! program only while a guard word is zero, setting it (wasi-libc's `started` flag, which
//! makes a second `_start` trap): the word is cleared in the snapshot. [`with_memory`]
//! refuses any other shape.

/// The module `wasm` with its memory's initial contents replaced by `memory` (a snapshot of
/// that module's linear memory): every other section is copied as it is, custom sections
/// (debug info) are dropped, the memory's minimum grows to the snapshot's pages, and the data
/// section becomes the snapshot's non-zero runs.
pub(crate) fn with_memory(wasm: &[u8], memory: &[u8]) -> Result<Vec<u8>, String> {
    const PAGE: usize = 65536;
    if wasm.len() < 8 || &wasm[..4] != b"\0asm" || wasm[4..8] != [1, 0, 0, 0] {
        return Err("not a core wasm module".into());
    }
    if !memory.len().is_multiple_of(PAGE) {
        return Err(format!(
            "a memory of {} bytes is not whole pages",
            memory.len()
        ));
    }
    let guard = start_guard(wasm)? as usize;
    let mut memory = memory.to_vec();
    memory
        .get_mut(guard..guard + 4)
        .ok_or_else(|| format!("the start guard at {guard} is outside the memory"))?
        .fill(0);
    let memory = memory.as_slice();
    let mut out = wasm[..8].to_vec();
    let mut at = 8;
    let mut saw_data = false;
    while at < wasm.len() {
        let (id, body, next) = section(wasm, at)?;
        at = next;
        match id {
            0 => {}
            5 => push_section(&mut out, 5, &memory_section(body, memory.len() / PAGE)?),
            6 => {
                check_globals(body)?;
                push_section(&mut out, 6, body);
            }
            11 => {
                saw_data = true;
                push_section(&mut out, 11, &data_section(memory));
            }
            12 => return Err("a data count section (passive segments) is not supported".into()),
            _ => push_section(&mut out, id, body),
        }
    }
    if !saw_data {
        return Err("the module has no data section".into());
    }
    Ok(out)
}

/// The section at `at`: its id, its body and where the next one starts.
fn section(wasm: &[u8], at: usize) -> Result<(u8, &[u8], usize), String> {
    let id = wasm[at];
    let (size, n) = read_leb(&wasm[at + 1..]).ok_or("a section size is malformed")?;
    let start = at + 1 + n;
    let end = usize::try_from(size)
        .ok()
        .and_then(|s| start.checked_add(s))
        .filter(|&end| end <= wasm.len())
        .ok_or("a section runs past the module's end")?;
    Ok((id, &wasm[start..end], end))
}

/// The address of `_start`'s guard word: its body must begin
/// `block; i32.const A; i32.load; i32.eqz; if`.
fn start_guard(wasm: &[u8]) -> Result<u32, String> {
    let mut imported_funcs = 0u64;
    let mut start_func = None;
    let mut code = None;
    let mut at = 8;
    while at < wasm.len() {
        let (id, body, next) = section(wasm, at)?;
        at = next;
        match id {
            2 => imported_funcs = count_imported_funcs(body).ok_or("malformed import section")?,
            7 => start_func = find_export(body, "_start"),
            10 => code = Some(body),
            _ => {}
        }
    }
    let func = start_func.ok_or("no `_start` function export")?;
    let index = func
        .checked_sub(imported_funcs)
        .ok_or("`_start` is an imported function")?;
    let code = code.ok_or("no code section")?;
    let body = nth_body(code, index).ok_or("`_start`'s body is not in the code section")?;
    // Skip the local declarations.
    let (groups, mut i) = read_leb(body).ok_or("malformed locals")?;
    for _ in 0..groups {
        let (_, n) = read_leb(body.get(i..).unwrap_or_default()).ok_or("malformed locals")?;
        i += n + 1;
    }
    let ops = &body[i.min(body.len())..];
    let refused = || "`_start` does not begin with a guard word (`if (!started)`)".to_string();
    if !ops.starts_with(&[0x02, 0x40, 0x41]) {
        return Err(refused());
    }
    let (addr, n) = read_sleb(&ops[3..]).ok_or_else(refused)?;
    let rest = &ops[3 + n..];
    // i32.load (any alignment, offset 0), i32.eqz, if (empty block type).
    match rest {
        [0x28, _, 0x00, 0x45, 0x04, 0x40, ..] => u32::try_from(addr).map_err(|_| refused()),
        _ => Err(refused()),
    }
}

/// How many functions the import section imports (other kinds are skipped).
fn count_imported_funcs(body: &[u8]) -> Option<u64> {
    let (count, mut i) = read_leb(body)?;
    let mut funcs = 0;
    for _ in 0..count {
        for _ in 0..2 {
            let (len, n) = read_leb(body.get(i..)?)?;
            i += n + len as usize;
        }
        let kind = *body.get(i)?;
        i += 1;
        match kind {
            0 => {
                funcs += 1;
                i += read_leb(body.get(i..)?)?.1;
            }
            1 => i += 1 + limits_len(body.get(i + 1..)?)?,
            2 => i += limits_len(body.get(i..)?)?,
            3 => i += 2,
            4 => i += 1 + read_leb(body.get(i + 1..)?)?.1,
            _ => return None,
        }
    }
    Some(funcs)
}

/// Bytes of a limits encoding (flags, minimum, and a maximum when flag bit 0 is set).
fn limits_len(b: &[u8]) -> Option<usize> {
    let flags = *b.first()?;
    let (_, n) = read_leb(b.get(1..)?)?;
    let mut len = 1 + n;
    if flags & 1 != 0 {
        len += read_leb(b.get(len..)?)?.1;
    }
    Some(len)
}

/// The function index the export section gives `name`.
fn find_export(body: &[u8], name: &str) -> Option<u64> {
    let (count, mut i) = read_leb(body)?;
    for _ in 0..count {
        let (len, n) = read_leb(body.get(i..)?)?;
        let field = body.get(i + n..i + n + len as usize)?;
        i += n + len as usize;
        let kind = *body.get(i)?;
        let (index, n) = read_leb(body.get(i + 1..)?)?;
        i += 1 + n;
        if kind == 0 && field == name.as_bytes() {
            return Some(index);
        }
    }
    None
}

/// The `index`-th function body of the code section.
fn nth_body(code: &[u8], index: u64) -> Option<&[u8]> {
    let (count, mut i) = read_leb(code)?;
    if index >= count {
        return None;
    }
    for k in 0..=index {
        let (size, n) = read_leb(code.get(i..)?)?;
        let body = code.get(i + n..i + n + size as usize)?;
        if k == index {
            return Some(body);
        }
        i += n + size as usize;
    }
    None
}

/// One memory, its minimum raised to `pages` (its maximum, if any, kept).
fn memory_section(body: &[u8], pages: usize) -> Result<Vec<u8>, String> {
    let malformed = || "malformed memory section".to_string();
    let (count, mut i) = read_leb(body).ok_or_else(malformed)?;
    if count != 1 {
        return Err(format!("{count} memories (one expected)"));
    }
    let flags = *body.get(i).ok_or_else(malformed)?;
    i += 1;
    if flags & !1 != 0 {
        return Err(format!(
            "memory flags {flags:#x} (shared or 64-bit) are not supported"
        ));
    }
    let (min, n) = read_leb(body.get(i..).ok_or_else(malformed)?).ok_or_else(malformed)?;
    i += n;
    let mut out = vec![1, flags];
    write_leb(&mut out, min.max(pages as u64));
    out.extend_from_slice(body.get(i..).ok_or_else(malformed)?);
    Ok(out)
}

/// The only global must be a mutable `i32` (wasm-ld's `__stack_pointer`), which the new module
/// keeps at its initial value.
fn check_globals(body: &[u8]) -> Result<(), String> {
    let (count, i) = read_leb(body).ok_or("malformed global section")?;
    match (count, body.get(i), body.get(i + 1)) {
        (1, Some(0x7f), Some(1)) => Ok(()),
        _ => Err(format!(
            "{count} globals; only a module whose one global is its stack pointer can be resumed"
        )),
    }
}

/// Active segments for memory 0 holding the non-zero runs of `memory`; runs less than 4 KiB
/// apart share a segment.
fn data_section(memory: &[u8]) -> Vec<u8> {
    const GAP: usize = 4096;
    let mut runs: Vec<(usize, usize)> = Vec::new();
    let mut i = 0;
    while i < memory.len() {
        if memory[i] == 0 {
            i += 1;
            continue;
        }
        let start = i;
        let mut end = i + 1;
        let mut zeros = 0;
        i += 1;
        while i < memory.len() && zeros < GAP {
            if memory[i] == 0 {
                zeros += 1;
            } else {
                zeros = 0;
                end = i + 1;
            }
            i += 1;
        }
        runs.push((start, end));
    }
    let mut out = Vec::new();
    write_leb(&mut out, runs.len() as u64);
    for (start, end) in runs {
        out.push(0); // active, memory 0
        out.push(0x41); // i32.const
        write_sleb(&mut out, start as i64);
        out.push(0x0b); // end
        write_leb(&mut out, (end - start) as u64);
        out.extend_from_slice(&memory[start..end]);
    }
    out
}

fn push_section(out: &mut Vec<u8>, id: u8, body: &[u8]) {
    out.push(id);
    write_leb(out, body.len() as u64);
    out.extend_from_slice(body);
}

/// An unsigned LEB128 and its length in bytes.
fn read_leb(b: &[u8]) -> Option<(u64, usize)> {
    let mut value = 0u64;
    for (i, byte) in b.iter().enumerate().take(10) {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((value, i + 1));
        }
    }
    None
}

/// A signed LEB128 (up to 64 bits) and its length in bytes.
fn read_sleb(b: &[u8]) -> Option<(i64, usize)> {
    let mut value = 0i64;
    let mut shift = 0;
    for (i, byte) in b.iter().enumerate().take(10) {
        value |= i64::from(byte & 0x7f) << shift;
        shift += 7;
        if byte & 0x80 == 0 {
            if shift < 64 && byte & 0x40 != 0 {
                value |= -1i64 << shift;
            }
            return Some((value, i + 1));
        }
    }
    None
}

fn write_leb(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

fn write_sleb(out: &mut Vec<u8>, mut v: i64) {
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        let done = (v == 0 && byte & 0x40 == 0) || (v == -1 && byte & 0x40 != 0);
        if done {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `_start`: `block; if (i32.load(32) == 0) { i32.store(32, 1) } end`.
    const START_BODY: [u8; 22] = [
        1, 20, 0, 0x02, 0x40, 0x41, 32, 0x28, 2, 0, 0x45, 0x04, 0x40, 0x41, 32, 0x41, 1, 0x36, 2,
        0, 0x0b, 0x0b,
    ];

    /// A module of one memory, one mutable i32 global, one data segment and `_start`.
    fn module() -> Vec<u8> {
        let mut m = b"\0asm\x01\0\0\0".to_vec();
        push_section(&mut m, 1, &[1, 0x60, 0, 0]); // type () -> ()
        push_section(&mut m, 3, &[1, 0]); // one function of type 0
        push_section(&mut m, 5, &[1, 0, 1]); // memory, min 1 page
        push_section(&mut m, 6, &[1, 0x7f, 1, 0x41, 0x80, 0x80, 0x04, 0x0b]); // mut i32 = 65536
        push_section(&mut m, 7, &[1, 6, b'_', b's', b't', b'a', b'r', b't', 0, 0]);
        push_section(&mut m, 10, &START_BODY); // if (!guard@32) { guard = 1 }
        push_section(&mut m, 11, &[1, 0, 0x41, 16, 0x0b, 2, 7, 9]); // bytes 7, 9 at 16
        push_section(&mut m, 0, &[4, b'n', b'a', b'm', b'e', 1, 2, 3]);
        m
    }

    #[test]
    fn the_snapshot_becomes_the_data_and_the_rest_is_kept() {
        let mut memory = vec![0u8; 2 * 65536];
        memory[100] = 1;
        memory[101] = 2;
        memory[103] = 3; // one zero byte between: the same segment
        memory[70_000] = 4; // a page away: a segment of its own
        memory[32] = 1; // the guard: cleared
        let out = with_memory(&module(), &memory).expect("resumable");
        let mut want = b"\0asm\x01\0\0\0".to_vec();
        push_section(&mut want, 1, &[1, 0x60, 0, 0]);
        push_section(&mut want, 3, &[1, 0]);
        push_section(&mut want, 5, &[1, 0, 2]);
        push_section(&mut want, 6, &[1, 0x7f, 1, 0x41, 0x80, 0x80, 0x04, 0x0b]);
        push_section(
            &mut want,
            7,
            &[1, 6, b'_', b's', b't', b'a', b'r', b't', 0, 0],
        );
        push_section(&mut want, 10, &START_BODY);
        let mut data = vec![2];
        data.extend([0, 0x41, 0xe4, 0x00, 0x0b, 4, 1, 2, 0, 3]); // 100: i32.const sleb(100)
        data.extend([0, 0x41, 0xf0, 0xa2, 0x04, 0x0b, 1, 4]); // 70000
        push_section(&mut want, 11, &data);
        assert_eq!(out, want);
    }

    #[test]
    fn other_shapes_are_refused() {
        let memory = vec![0u8; 65536];
        assert!(with_memory(b"\0asm\x02\0\0\0", &memory).is_err());
        assert!(with_memory(&module(), &[0; 100]).is_err());
        // Two globals: the second's value would be lost.
        let two = module();
        let at = two
            .windows(3)
            .position(|w| w == [6, 8, 1])
            .expect("global section");
        let mut bad = two[..at].to_vec();
        push_section(
            &mut bad,
            6,
            &[2, 0x7f, 1, 0x41, 0, 0x0b, 0x7f, 1, 0x41, 0, 0x0b],
        );
        bad.extend_from_slice(&two[at + 10..]);
        let e = with_memory(&bad, &memory).expect_err("refused");
        assert!(e.contains("2 globals"), "{e}");
        // A `_start` without the guard: a second run would redo (or refuse) its start-up.
        let unguarded = module();
        let at = unguarded
            .windows(START_BODY.len())
            .position(|w| w == START_BODY)
            .expect("code section");
        let mut bad = unguarded[..at - 2].to_vec();
        push_section(&mut bad, 10, &[1, 2, 0, 0x0b]);
        bad.extend_from_slice(&unguarded[at + START_BODY.len()..]);
        let e = with_memory(&bad, &memory).expect_err("refused");
        assert!(e.contains("guard"), "{e}");
    }

    #[test]
    fn lebs_round_trip() {
        for v in [0u64, 1, 127, 128, 300, 1 << 21, u64::from(u32::MAX)] {
            let mut b = Vec::new();
            write_leb(&mut b, v);
            assert_eq!(read_leb(&b), Some((v, b.len())));
        }
        let mut b = Vec::new();
        write_sleb(&mut b, 64);
        assert_eq!(b, [0xc0, 0x00]);
    }
}
