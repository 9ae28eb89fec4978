//! HTTP/1.1 on the wire, as the minimal clients of the HTTP benchmarks read it.

/// A response head in `buf`: `Ok(None)` while it is incomplete, else the status and the whole
/// response's length (head and `Content-Length` bytes of body).
pub fn parse_head(buf: &[u8]) -> Result<Option<(u16, usize)>, String> {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Ok(None);
    };
    let head = std::str::from_utf8(&buf[..end]).map_err(|_| "a response head not in UTF-8")?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let status = status_line
        .strip_prefix("HTTP/1.1 ")
        .and_then(|r| r.get(..3))
        .and_then(|c| c.parse::<u16>().ok())
        .ok_or(format!("a bad status line {status_line:?}"))?;
    let mut length = None;
    for line in lines {
        let (name, value) = line.split_once(':').unwrap_or((line, ""));
        if name.eq_ignore_ascii_case("content-length") {
            length = value.trim().parse::<usize>().ok();
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            return Err("a chunked response (the raw client needs Content-Length)".into());
        }
    }
    let length = length.ok_or("a response without Content-Length")?;
    Ok(Some((status, end + 4 + length)))
}
