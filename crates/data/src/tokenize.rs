//! Tokenizers: any `tokenizer.json` (a path, or a hub model repo such as `google-t5/t5-base` whose
//! file carries T5's SentencePiece vocabulary), a BPE or Unigram tokenizer trained on a corpus and
//! cached, or a byte-level fallback. Every tokenizer follows T5's id convention for its specials:
//! pad 0, eos 1, unk 2, and 100 sentinels `<extra_id_0..99>` counting down from the top id.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use serde::{Deserialize, Serialize};
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::models::unigram::{Unigram, UnigramTrainerBuilder};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::{AddedToken, Tokenizer, TokenizerImpl};

/// T5's specials, in id order.
pub const SPECIALS: [&str; 3] = ["<pad>", "</s>", "<unk>"];
/// Number of sentinel tokens (T5: 100).
pub const SENTINELS: usize = 100;

/// Which tokenizer to use; written `bytes`, `bpe:8192`, `unigram:8000`, `file:PATH` or `hub:REPO`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum TokenizerSpec {
    /// 3 specials + 256 bytes + 100 sentinels (359 ids); never fails, needs no training.
    Bytes,
    /// Byte-level BPE (GPT-2 style, lossless) trained on the corpus with this vocabulary size.
    Bpe(usize),
    /// Unigram (SentencePiece-style, Metaspace) trained on the corpus with this vocabulary size.
    Unigram(usize),
    /// A `tokenizer.json` on disk.
    File(PathBuf),
    /// `tokenizer.json` of a hub model repo, e.g. `google-t5/t5-base` (feature `hub`).
    Hub(String),
}

impl FromStr for TokenizerSpec {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        let size = |v: &str| -> Result<usize> {
            v.parse::<usize>()
                .ok()
                .filter(|&n| n > SPECIALS.len() + SENTINELS + 256)
                .ok_or_else(|| {
                    anyhow!(
                        "tokenizer `{s}`: the vocabulary size must be an integer above {}",
                        SPECIALS.len() + SENTINELS + 256
                    )
                })
        };
        match s.split_once(':') {
            None if s == "bytes" => Ok(Self::Bytes),
            Some(("bpe", v)) => Ok(Self::Bpe(size(v)?)),
            Some(("unigram", v)) => Ok(Self::Unigram(size(v)?)),
            Some(("file", p)) => Ok(Self::File(p.into())),
            Some(("hub", r)) => Ok(Self::Hub(r.into())),
            _ => bail!(
                "unknown tokenizer `{s}`; use bytes, bpe:SIZE, unigram:SIZE, file:PATH or hub:REPO"
            ),
        }
    }
}

impl TryFrom<String> for TokenizerSpec {
    type Error = anyhow::Error;
    fn try_from(s: String) -> Result<Self> {
        s.parse()
    }
}

impl From<TokenizerSpec> for String {
    fn from(t: TokenizerSpec) -> String {
        match t {
            TokenizerSpec::Bytes => "bytes".into(),
            TokenizerSpec::Bpe(n) => format!("bpe:{n}"),
            TokenizerSpec::Unigram(n) => format!("unigram:{n}"),
            TokenizerSpec::File(p) => format!("file:{}", p.display()),
            TokenizerSpec::Hub(r) => format!("hub:{r}"),
        }
    }
}

/// A loaded tokenizer and a description of it for provenance.
#[derive(Clone)]
pub struct Tok {
    inner: Option<Tokenizer>,
    /// What it is and where it came from (recorded with every result).
    pub description: String,
}

const BYTE_OFFSET: u32 = SPECIALS.len() as u32;
const BYTE_VOCAB: usize = SPECIALS.len() + 256 + SENTINELS;

impl Tok {
    pub fn bytes() -> Self {
        Tok {
            inner: None,
            description: "bytes (pad 0, eos 1, unk 2, bytes 3..258, sentinels 259..358)".into(),
        }
    }

    pub fn from_file(path: &Path) -> Result<Self> {
        let t = Tokenizer::from_file(path).map_err(|e| {
            anyhow!(
                "{} is not a tokenizer.json ({e}); check the path or re-create it",
                path.display()
            )
        })?;
        let vocab = t.get_vocab_size(true);
        Ok(Tok {
            inner: Some(t),
            description: format!("{} ({vocab} ids)", path.display()),
        })
    }

    pub fn pad_id(&self) -> u32 {
        0
    }

    pub fn eos_id(&self) -> u32 {
        self.inner
            .as_ref()
            .and_then(|t| t.token_to_id("</s>"))
            .unwrap_or(1)
    }

    pub fn vocab_size(&self) -> usize {
        self.inner
            .as_ref()
            .map(|t| t.get_vocab_size(true))
            .unwrap_or(BYTE_VOCAB)
    }

    /// Id of sentinel `<extra_id_i>`; T5's sentinels count down from the top id.
    pub fn sentinel_id(&self, i: usize) -> u32 {
        assert!(i < SENTINELS, "T5 has {SENTINELS} sentinels");
        match &self.inner {
            Some(t) => t
                .token_to_id(&format!("<extra_id_{i}>"))
                .unwrap_or((t.get_vocab_size(true) - 1 - i) as u32),
            None => (BYTE_VOCAB - 1 - i) as u32,
        }
    }

    /// The `[MASK]` of BERT-style masking: `<mask>` / `[MASK]` when the vocabulary has one, else
    /// `<extra_id_0>` (T5's vocabulary has no mask token).
    pub fn mask_id(&self) -> u32 {
        self.inner
            .as_ref()
            .and_then(|t| t.token_to_id("<mask>").or_else(|| t.token_to_id("[MASK]")))
            .unwrap_or_else(|| self.sentinel_id(0))
    }

    /// Ids never chosen as BERT's random replacement or as masking targets.
    pub fn is_special(&self, id: u32) -> bool {
        id < BYTE_OFFSET || id as usize >= self.vocab_size() - SENTINELS
    }

    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        match &self.inner {
            Some(t) => Ok(t
                .encode(text, false)
                .map_err(|e| anyhow!("tokenizer: {e}"))?
                .get_ids()
                .to_vec()),
            None => Ok(text.bytes().map(|b| b as u32 + BYTE_OFFSET).collect()),
        }
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        match &self.inner {
            Some(t) => t.decode(ids, true).map_err(|e| anyhow!("tokenizer: {e}")),
            None => {
                let bytes: Vec<u8> = ids
                    .iter()
                    .filter(|&&i| (BYTE_OFFSET..BYTE_OFFSET + 256).contains(&i))
                    .map(|&i| (i - BYTE_OFFSET) as u8)
                    .collect();
                Ok(String::from_utf8_lossy(&bytes).into_owned())
            }
        }
    }
}

type Wrapped<M> = TokenizerImpl<
    M,
    tokenizers::NormalizerWrapper,
    tokenizers::PreTokenizerWrapper,
    tokenizers::PostProcessorWrapper,
    tokenizers::DecoderWrapper,
>;

fn special_tokens() -> Vec<AddedToken> {
    SPECIALS
        .iter()
        .map(|s| AddedToken::from(*s, true))
        .collect()
}

/// Sentinels added after training so `<extra_id_0>` gets the top id.
fn add_sentinels<M, N, PT, PP, D>(t: &mut TokenizerImpl<M, N, PT, PP, D>) -> Result<()>
where
    M: tokenizers::Model,
    N: tokenizers::Normalizer,
    PT: tokenizers::PreTokenizer,
    PP: tokenizers::PostProcessor,
    D: tokenizers::Decoder,
{
    let sentinels: Vec<AddedToken> = (0..SENTINELS)
        .rev()
        .map(|i| AddedToken::from(format!("<extra_id_{i}>"), true))
        .collect();
    t.add_special_tokens(sentinels)
        .map_err(|e| anyhow!("adding sentinels: {e}"))?;
    Ok(())
}

/// Trains a tokenizer on `texts`; returns it and the seconds training took.
pub fn train(
    spec: &TokenizerSpec,
    texts: impl Iterator<Item = String> + Send,
) -> Result<(Tokenizer, f64)> {
    let start = Instant::now();
    let tokenizer: Tokenizer = match *spec {
        TokenizerSpec::Bpe(vocab) => {
            let mut trainer = BpeTrainerBuilder::new()
                .vocab_size(vocab - SENTINELS)
                .show_progress(false)
                .special_tokens(special_tokens())
                .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
                .build();
            let mut t: Wrapped<BPE> = TokenizerImpl::new(BPE::default());
            t.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
            t.with_decoder(Some(ByteLevelDecoder::default()));
            t.train(&mut trainer, texts)
                .map_err(|e| anyhow!("training BPE: {e}"))?;
            add_sentinels(&mut t)?;
            Tokenizer::from(t)
        }
        TokenizerSpec::Unigram(vocab) => {
            let mut trainer = UnigramTrainerBuilder::default()
                .vocab_size((vocab - SENTINELS) as u32)
                .show_progress(false)
                .special_tokens(special_tokens())
                .unk_token(Some("<unk>".into()))
                .build()
                .map_err(|e| anyhow!("unigram trainer: {e}"))?;
            let mut t: Wrapped<Unigram> = TokenizerImpl::new(Unigram::default());
            t.with_pre_tokenizer(Some(Metaspace::new('▁', PrependScheme::Always, true)));
            t.with_decoder(Some(Metaspace::new('▁', PrependScheme::Always, true)));
            t.train(&mut trainer, texts)
                .map_err(|e| anyhow!("training Unigram: {e}"))?;
            add_sentinels(&mut t)?;
            Tokenizer::from(t)
        }
        _ => bail!("only bpe:SIZE and unigram:SIZE tokenizers are trained"),
    };
    Ok((tokenizer, start.elapsed().as_secs_f64()))
}

impl TokenizerSpec {
    /// The vocabulary size the tokenizer will have, where the spec alone fixes it (bytes, and a
    /// trained BPE or Unigram of a given size); a file's or a hub model's must be read.
    pub fn known_vocab_size(&self) -> Option<usize> {
        match self {
            TokenizerSpec::Bytes => Some(BYTE_VOCAB),
            TokenizerSpec::Bpe(n) | TokenizerSpec::Unigram(n) => Some(*n),
            TokenizerSpec::File(_) | TokenizerSpec::Hub(_) => None,
        }
    }
}

/// The tokenizer `spec` of a corpus: built in, read from a file or the hub, or trained on the texts
/// of `train_files` (the dataset `dataset`'s train split) on first use and cached under
/// `options.local_root/tokenizers`. What every experiment that tokenizes a corpus calls.
pub fn for_corpus(
    spec: &TokenizerSpec,
    dataset: &'static crate::registry::DatasetSpec,
    train_files: &[PathBuf],
    options: &crate::source::SourceOptions,
) -> Result<Tok> {
    load(
        spec,
        dataset.name,
        &options.local_root.join("tokenizers"),
        || {
            let docs = crate::source::ExampleStream::open_at(
                dataset,
                train_files.to_vec(),
                Default::default(),
            )?;
            Ok(Box::new(docs.filter_map(Result::ok).map(|e| e.all_text())))
        },
    )
}

/// Loads the tokenizer `spec` names. Trained tokenizers are cached in `cache_dir` under
/// `<corpus>-<kind>-<size>.json` and trained on `corpus_texts()` only when that file is missing.
pub fn load(
    spec: &TokenizerSpec,
    corpus: &str,
    cache_dir: &Path,
    corpus_texts: impl FnOnce() -> Result<Box<dyn Iterator<Item = String> + Send>>,
) -> Result<Tok> {
    match spec {
        TokenizerSpec::Bytes => Ok(Tok::bytes()),
        TokenizerSpec::File(p) => Tok::from_file(p),
        TokenizerSpec::Hub(repo) => hub_tokenizer(repo),
        TokenizerSpec::Bpe(n) | TokenizerSpec::Unigram(n) => {
            let kind = if matches!(spec, TokenizerSpec::Bpe(_)) {
                "bpe"
            } else {
                "unigram"
            };
            let path = cache_dir.join(format!("{corpus}-{kind}-{n}.json"));
            if !path.exists() {
                let (t, secs) = train(spec, corpus_texts()?)?;
                std::fs::create_dir_all(cache_dir)
                    .with_context(|| format!("cannot create {}", cache_dir.display()))?;
                let tmp = path.with_extension("json.tmp");
                t.save(&tmp, false)
                    .map_err(|e| anyhow!("cannot write {}: {e}", tmp.display()))?;
                std::fs::rename(&tmp, &path)?;
                eprintln!(
                    "trained {kind}:{n} on {corpus} in {secs:.1} s → {}",
                    path.display()
                );
            }
            let mut tok = Tok::from_file(&path)?;
            tok.description = format!("{kind}:{n} trained on {corpus} train ({})", path.display());
            Ok(tok)
        }
    }
}

#[cfg(feature = "hub")]
fn hub_tokenizer(repo: &str) -> Result<Tok> {
    let (owner, name) = repo
        .split_once('/')
        .ok_or_else(|| anyhow!("hub tokenizer `{repo}`: expected OWNER/NAME"))?;
    let client = hf_hub::HFClient::builder()
        .build_sync()
        .map_err(|e| anyhow!("hub client: {e}"))?;
    let path = client.model(owner, name).download_file().filename("tokenizer.json").send().map_err(|e| {
        anyhow!("cannot get tokenizer.json of {repo} ({e}); download it where the hub is reachable and pass file:PATH")
    })?;
    let mut tok = Tok::from_file(&path)?;
    tok.description = format!("{repo} tokenizer.json ({} ids)", tok.vocab_size());
    Ok(tok)
}

#[cfg(not(feature = "hub"))]
fn hub_tokenizer(repo: &str) -> Result<Tok> {
    bail!(
        "tokenizer hub:{repo}: built without the `hub` feature; pass file:PATH to its tokenizer.json"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_and_t5_ids() {
        let t = Tok::bytes();
        let ids = t.encode("Thy self thy foe — ").unwrap();
        assert_eq!(t.decode(&ids).unwrap(), "Thy self thy foe — ");
        assert_eq!(t.sentinel_id(0), 358);
        assert_eq!(t.sentinel_id(99), 259);
        assert!(t.is_special(0) && t.is_special(300) && !t.is_special(100));
    }

    #[test]
    fn spec_parsing() {
        assert_eq!(
            "bpe:8192".parse::<TokenizerSpec>().unwrap(),
            TokenizerSpec::Bpe(8192)
        );
        assert!("bpe:10".parse::<TokenizerSpec>().is_err());
        assert!(
            "wordpiece:1000"
                .parse::<TokenizerSpec>()
                .unwrap_err()
                .to_string()
                .contains("unknown tokenizer")
        );
    }

    #[test]
    fn trained_bpe_is_lossless_with_t5_specials() {
        let texts: Vec<String> = (0..200)
            .map(|i| format!("To be, or not to be, that is the question {i}."))
            .collect();
        let (t, _) = train(&TokenizerSpec::Bpe(500), texts.into_iter()).unwrap();
        assert_eq!(t.token_to_id("<pad>"), Some(0));
        assert_eq!(t.token_to_id("</s>"), Some(1));
        assert_eq!(t.token_to_id("<unk>"), Some(2));
        let top = t.get_vocab_size(true) as u32 - 1;
        assert_eq!(t.token_to_id("<extra_id_0>"), Some(top));
        assert_eq!(t.token_to_id("<extra_id_99>"), Some(top - 99));
        let enc = t.encode("Whether 'tis nobler in the mind", false).unwrap();
        assert_eq!(
            t.decode(enc.get_ids(), true).unwrap(),
            "Whether 'tis nobler in the mind"
        );
    }
}
