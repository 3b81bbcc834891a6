//! A small hub on 127.0.0.1 serving fixture files under the hub's URL scheme (one dataset repo's
//! `/api/datasets/{owner}/{name}/tree/main` and `/api/models/{owner}/{name}/tree/main`, `HEAD`/`GET
//! .../resolve/main/{path}` with ETag, X-Repo-Commit, Content-Length and byte ranges), logging every
//! request. Parquet files are listed as LFS files with their SHA-256, as the hub lists them.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use sha2::Digest;

pub const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

pub struct Hub {
    /// The dataset repo served (`owner/name`); its files are the keys without a model's prefix.
    pub dataset_repo: String,
    pub port: u16,
    pub files: BTreeMap<String, Vec<u8>>,
    /// (method, path, Range header) of every request.
    pub log: Mutex<Vec<(String, String, Option<String>)>>,
    /// When non-zero, the n-th ranged GET from now on sends half its body and hangs up.
    pub cut_at: AtomicUsize,
    /// A file served with one byte flipped (its listing keeps the true SHA-256).
    pub tamper: Mutex<Option<String>>,
    pub ranged_gets: AtomicUsize,
}

impl Hub {
    /// Serves wmt14's repo (`wmt/wmt14`) and model repos.
    pub fn start(files: BTreeMap<String, Vec<u8>>) -> Arc<Hub> {
        Self::start_repo("wmt/wmt14", files)
    }

    /// Serves dataset repo `repo` (`owner/name`) and model repos.
    pub fn start_repo(repo: &str, files: BTreeMap<String, Vec<u8>>) -> Arc<Hub> {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let hub = Arc::new(Hub {
            dataset_repo: repo.to_string(),
            port: listener.local_addr().unwrap().port(),
            files,
            log: Mutex::new(Vec::new()),
            cut_at: AtomicUsize::new(0),
            tamper: Mutex::new(None),
            ranged_gets: AtomicUsize::new(0),
        });
        let h = hub.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let h = h.clone();
                std::thread::spawn(move || h.serve(stream));
            }
        });
        hub
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn serve(&self, mut stream: TcpStream) {
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut request = String::new();
        if reader.read_line(&mut request).is_err() || request.is_empty() {
            return;
        }
        let mut range = None;
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            if line.trim().is_empty() {
                break;
            }
            if let Some((k, v)) = line.split_once(':')
                && k.eq_ignore_ascii_case("range")
            {
                range = Some(v.trim().to_string());
            }
        }
        let mut parts = request.split_whitespace();
        let (method, target) = (
            parts.next().unwrap().to_string(),
            parts.next().unwrap().to_string(),
        );
        self.log
            .lock()
            .unwrap()
            .push((method.clone(), target.clone(), range.clone()));
        let path = target.split('?').next().unwrap().replace("%2F", "/");

        // Listings: the dataset repo's files are the keys without a model owner's prefix, a model
        // repo's are the keys under `<owner>/<name>/`.
        let listing_prefix = format!("/api/datasets/{}/tree/main", self.dataset_repo);
        let resolve_prefix = format!("/datasets/{}/resolve/main/", self.dataset_repo);
        let listing = match (
            path.strip_prefix(listing_prefix.as_str()),
            path.strip_prefix("/api/models/")
                .and_then(|p| p.split_once("/tree/main")),
        ) {
            (Some(rest), _) => Some((rest.to_string(), None)),
            (None, Some((repo, rest))) => Some((rest.to_string(), Some(format!("{repo}/")))),
            _ => None,
        };
        if let Some((rest, model)) = listing {
            assert!(
                rest.is_empty() || rest == "/",
                "listing a subdirectory: {rest}"
            );
            let mut entries = Vec::new();
            if model.is_none() {
                let dirs: std::collections::BTreeSet<&str> = self
                    .files
                    .keys()
                    .filter_map(|p| p.split_once('/').map(|(d, _)| d))
                    .filter(|d| *d != "google")
                    .collect();
                for d in dirs {
                    entries.push(serde_json::json!({"type": "directory", "oid": "d", "path": d}));
                }
            }
            for (p, bytes) in &self.files {
                let p = match &model {
                    Some(prefix) => match p.strip_prefix(prefix.as_str()) {
                        Some(p) => p,
                        None => continue,
                    },
                    None if p.starts_with("google") => continue,
                    None => p,
                };
                let mut entry = serde_json::json!({"type": "file", "oid": format!("{:040x}", bytes.len()), "size": bytes.len(), "path": p});
                if p.ends_with(".parquet") {
                    entry["lfs"] = serde_json::json!({"oid": sha256_hex(bytes), "size": bytes.len(), "pointerSize": 134});
                }
                entries.push(entry);
            }
            let body = serde_json::to_vec(&entries).unwrap();
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(&body);
            return;
        }
        // Dataset files are keyed by their path in the repo, model files by `<owner>/<name>/<path>`.
        let file = match (
            path.strip_prefix(resolve_prefix.as_str()),
            path.split_once("/resolve/main/"),
        ) {
            (Some(f), _) => f.to_string(),
            (None, Some((repo, f))) => format!("{}/{f}", repo.trim_start_matches('/')),
            _ => String::new(),
        };
        let Some(bytes) = self.files.get(&file) else {
            let _ = write!(
                stream,
                "HTTP/1.1 404 Not Found\r\nX-Error-Code: EntryNotFound\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
            return;
        };
        // An LFS file's ETag is its SHA-256, as on the hub; others get a hash of their bytes.
        let etag = if file.ends_with(".parquet") {
            sha256_hex(bytes)
        } else {
            format!(
                "{:016x}",
                bytes
                    .iter()
                    .fold(0xcbf29ce484222325u64, |h, b| (h ^ *b as u64)
                        .wrapping_mul(0x100000001b3))
            )
        };
        let common = format!(
            "ETag: \"{etag}\"\r\nX-Repo-Commit: {COMMIT}\r\nAccept-Ranges: bytes\r\nConnection: close\r\n"
        );
        if method == "HEAD" {
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\n{common}Content-Length: {}\r\n\r\n",
                bytes.len()
            );
            return;
        }
        let (start, end) = match &range {
            Some(r) => {
                let (a, b) = r.trim_start_matches("bytes=").split_once('-').unwrap();
                (
                    a.parse::<usize>().unwrap(),
                    b.parse::<usize>()
                        .map(|b| b + 1)
                        .unwrap_or(bytes.len())
                        .min(bytes.len()),
                )
            }
            None => (0, bytes.len()),
        };
        let mut bytes = bytes.clone();
        if self.tamper.lock().unwrap().as_deref() == Some(file.as_str()) {
            let last = bytes.len() - 1;
            bytes[last] ^= 0xff;
        }
        let body = &bytes[start..end];
        let status = if range.is_some() {
            "206 Partial Content"
        } else {
            "200 OK"
        };
        let _ = write!(
            stream,
            "HTTP/1.1 {status}\r\n{common}Content-Length: {}\r\nContent-Range: bytes {start}-{}/{}\r\n\r\n",
            body.len(),
            end - 1,
            bytes.len()
        );
        if range.is_some() {
            let n = self.ranged_gets.fetch_add(1, Ordering::SeqCst) + 1;
            if n == self.cut_at.load(Ordering::SeqCst) {
                let _ = stream.write_all(&body[..body.len() / 2]);
                let _ = stream.flush();
                let _ = stream.shutdown(std::net::Shutdown::Both);
                return;
            }
        }
        let _ = stream.write_all(body);
    }

    pub fn ranges_since(&self, from: usize) -> Vec<String> {
        self.log.lock().unwrap()[from..]
            .iter()
            .filter(|(m, _, _)| m == "GET")
            .filter_map(|(_, _, r)| r.clone())
            .collect()
    }
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl Hub {
    /// The files (keys of [`Hub::files`]) downloaded by GET requests, with how many requests each.
    pub fn fetched(&self) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for (method, target, _) in self.log.lock().unwrap().iter() {
            if method != "GET" {
                continue;
            }
            let path = target.split('?').next().unwrap().replace("%2F", "/");
            if let Some(file) = path.split_once("/resolve/main/").map(|(_, f)| f) {
                *out.entry(file.to_string()).or_default() += 1;
            }
        }
        out
    }
}
