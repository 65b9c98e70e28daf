//! Opening the source the keys name (map-style or a stream, for this rank) and the image
//! stages its fields get.

use std::sync::Arc;

use super::{LoaderOptions, OnError, Order};
use crate::collate::{ImageStages, Ragged, RaggedLayout};
use crate::decode::JpegDecoder;
use crate::dtype::{DType, Layout};
use crate::error::{Error, Result};
use crate::launch::Launch;
use crate::source::pixels::tensor_image_dims;
use crate::source::streaming::StreamSource;
use crate::source::tar::{TarConfig, TarSource, TarStream};
use crate::source::tokens::blend::BlendSource;
use crate::source::tokens::{Boundaries, Packing};
use crate::source::{
    open_parquet_table, FieldKind, FieldRules, FieldSpec, IterableStream, PackedSource, Source,
    SourceSpec, TokenConfig, TokenSource, TokenSpec,
};
use crate::transform::{roles, roles_with, Pipeline};

/// A loader's source once opened: map-style (read by index) or a stream.
pub(crate) enum OpenedSource {
    Indexed(Arc<dyn Source>),
    Stream(Arc<dyn StreamSource>),
}

/// What opening a source found: the source, and the damaged tar shards `on_error=skip` passes
/// over (each counts as one skipped sample).
pub(crate) struct Opened {
    pub source: OpenedSource,
    pub damaged: Vec<String>,
}

impl LoaderOptions {
    /// Whether these options make a streaming loader: tar shards with `shuffle_buffer ≥ 1`, or
    /// an iterable source.
    pub fn is_streaming(&self) -> bool {
        match &self.source {
            Some(SourceSpec::Tar(_)) => self.shuffle_buffer > 0,
            Some(SourceSpec::Iterable(_)) => true,
            _ => false,
        }
    }

    /// How tar shards are read under these options.
    pub(crate) fn tar_config(&self) -> TarConfig {
        TarConfig {
            fields: self.fields.clone(),
            pad: self.ragged_allowed(),
            skip_damaged: self.on_error == OnError::Skip,
            remote: crate::source::remote::RemoteConfig {
                shard_prefetch: self.shard_prefetch,
                cache_dir: self.cache_dir.clone(),
                cache_limit: self.cache_limit,
            },
            ..TarConfig::default()
        }
    }

    /// Opens the source. A stream (tar with `shuffle_buffer ≥ 1`, an iterable source) is opened
    /// for this rank; an iterable's stream of `epoch` is opened (continuing from `resume`, a
    /// state it saved after `given` samples) to learn the fields from its first sample.
    pub(crate) fn open_source(
        &self,
        launch: &Launch,
        seed: u64,
        epoch: u64,
        resume: Option<&str>,
        given: u64,
    ) -> Result<Opened> {
        if let Some(blend) = &self.blend {
            if self.source.is_some() {
                return Err(Error::option(
                    "blend",
                    "replaces `source`: set one of them, not both",
                ));
            }
            if self.labels.is_some() {
                return Err(Error::option("labels", "applies to npy sources only"));
            }
            let source = BlendSource::open(
                blend,
                &self.token_config()?,
                &self.tar_config().remote,
                seed,
            )?;
            return Ok(Opened {
                source: OpenedSource::Indexed(Arc::new(source)),
                damaged: Vec::new(),
            });
        }
        let spec = self.source.as_ref().ok_or_else(|| {
            Error::option("source", "required, e.g. npy:PATH or image_folder:ROOT")
        })?;
        let is_tar = matches!(spec, SourceSpec::Tar(_));
        let token_spec = self.token_spec();
        if token_spec.is_none() {
            self.check_no_token_keys()?;
        }
        if self.fields.is_some() && !is_tar {
            return Err(Error::option("fields", "applies to tar sources only"));
        }
        let table = matches!(spec, SourceSpec::Parquet(_)) && token_spec.is_none();
        if self.columns.is_some() && !table {
            return Err(Error::option(
                "columns",
                "applies to parquet: tables only (a parquet: source without tokenizer)",
            ));
        }
        let streaming = self.is_streaming();
        if self.shuffle_buffer > 0 && !streaming {
            return Err(Error::option(
                "shuffle_buffer",
                "applies to tar and iterable sources only",
            ));
        }
        if streaming {
            self.check_stream_keys(matches!(spec, SourceSpec::Iterable(_)))?;
        }
        // Streams are split by the resolved launch, as the indexed samplers are dealt.
        let share = self.deal(launch);
        Ok(match spec {
            SourceSpec::Tar(pattern) if streaming => {
                let stream = TarStream::open_pattern(pattern, self.tar_config(), share, seed)?;
                let damaged = stream.damaged().to_vec();
                Opened {
                    source: OpenedSource::Stream(Arc::new(stream)),
                    damaged,
                }
            }
            SourceSpec::Tar(pattern) => {
                let source = TarSource::open_pattern(pattern, self.tar_config())?;
                let damaged = source.damaged().to_vec();
                Opened {
                    source: OpenedSource::Indexed(Arc::new(source)),
                    damaged,
                }
            }
            SourceSpec::Iterable(iterable) => {
                share.check("rank")?;
                let stream = IterableStream::new(
                    Arc::clone(iterable),
                    share,
                    seed,
                    epoch,
                    resume,
                    given,
                    self.num_samples,
                    self.field_rules(),
                )?;
                Opened {
                    source: OpenedSource::Stream(Arc::new(stream)),
                    damaged: Vec::new(),
                }
            }
            SourceSpec::Tokens(_) | SourceSpec::Parquet(_) if self.labels.is_some() => {
                return Err(Error::option("labels", "applies to npy sources only"));
            }
            SourceSpec::Parquet(pattern) if table => Opened {
                source: OpenedSource::Indexed(open_parquet_table(
                    pattern,
                    self.columns.as_deref(),
                    self.parquet_cache,
                    &self.tar_config().remote,
                )?),
                damaged: Vec::new(),
            },
            SourceSpec::Tokens(_) | SourceSpec::Parquet(_) => Opened {
                source: OpenedSource::Indexed(Arc::new(TokenSource::open_with(
                    &self.open_token_spec()?,
                    &self.token_config()?,
                    &self.tar_config().remote,
                )?)),
                damaged: Vec::new(),
            },
            SourceSpec::Packed(path) if self.labels.is_none() => Opened {
                source: OpenedSource::Indexed(Arc::new(PackedSource::open_with(
                    path,
                    &self.tar_config().remote,
                )?)),
                damaged: Vec::new(),
            },
            other => Opened {
                source: OpenedSource::Indexed(
                    other.open_with(self.labels.as_deref(), self.field_rules())?,
                ),
                damaged: Vec::new(),
            },
        })
    }

    /// Whether the source is a token stream (`megatron:`, `tokens:`, `parquet:` text, a
    /// `blend` of them).
    pub fn is_token_stream(&self) -> bool {
        self.blend.is_some() || self.token_spec().is_some()
    }

    /// The token source `source` names: `megatron:` and `tokens:`, and `parquet:` when read as
    /// text (with `tokenizer`, or with `seq_len`, which only tokens have: then the missing
    /// tokenizer is the error). Else a `parquet:` source is a table of images and numbers.
    fn token_spec(&self) -> Option<TokenSpec> {
        match &self.source {
            Some(SourceSpec::Tokens(spec)) => Some(spec.clone()),
            Some(SourceSpec::Parquet(pattern))
                if self.tokenizer.is_some() || self.seq_len.is_some() =>
            {
                Some(TokenSpec::Parquet(pattern.clone()))
            }
            _ => None,
        }
    }

    /// The one token source `source` names (not a blend); a `parquet:` source as text.
    fn open_token_spec(&self) -> Result<TokenSpec> {
        match &self.source {
            Some(SourceSpec::Tokens(spec)) => Ok(spec.clone()),
            Some(SourceSpec::Parquet(pattern)) => Ok(TokenSpec::Parquet(pattern.clone())),
            _ => Err(Error::option(
                "source",
                "expected one token source: megatron:PREFIX, tokens:PATTERN or parquet:PATTERN",
            )),
        }
    }

    /// How a token source cuts and delivers samples; `seq_len` is required.
    pub(crate) fn token_config(&self) -> Result<TokenConfig> {
        let named = self.token_spec();
        let specs: Vec<&TokenSpec> = match (&self.blend, &named) {
            (Some(blend), _) => blend.iter().map(|(_, spec)| spec).collect(),
            (None, Some(spec)) => vec![spec],
            _ => Vec::new(),
        };
        let flat = specs.iter().any(|s| matches!(s, TokenSpec::Flat(_)));
        let parquet = specs.iter().any(|s| matches!(s, TokenSpec::Parquet(_)));
        const MEGATRON: &str = "a Megatron index says the type and the documents";
        const TEXT: &str = "the other sources hold tokens, not text";
        for (key, set, applies, to, why) in [
            (
                "token_dtype",
                self.token_dtype.is_some(),
                flat,
                "tokens:PATTERN",
                MEGATRON,
            ),
            (
                "eos_token",
                self.eos_token.is_some(),
                flat || parquet,
                "tokens:PATTERN and parquet:PATTERN",
                MEGATRON,
            ),
            (
                "tokenizer",
                self.tokenizer.is_some(),
                parquet,
                "parquet:PATTERN",
                TEXT,
            ),
            (
                "text_column",
                self.text_column != "text",
                parquet,
                "parquet:PATTERN",
                TEXT,
            ),
        ] {
            if set && !applies {
                return Err(Error::option(
                    key,
                    format!("applies to {to} sources only ({why})"),
                ));
            }
        }
        if self.pad_token.is_some() && self.token_packing != Packing::Pad {
            return Err(Error::option(
                "pad_token",
                "applies to token_packing=pad only (concatenated windows have no padding)",
            ));
        }
        Ok(TokenConfig {
            seq_len: self.seq_len.ok_or_else(|| {
                Error::option(
                    "seq_len",
                    "required for a token source: the tokens of one sample (inputs), e.g. 2048",
                )
            })?,
            boundaries: self.document_boundaries,
            output: self.token_output_dtype,
            raw: self.token_dtype,
            eos: self.eos_token,
            vocab_size: self.vocab_size,
            tokenizer: self.tokenizer.clone(),
            text_column: self.text_column.clone(),
            packing: self.token_packing,
            // Bounded by the key's parser to `0..=i64::MAX`.
            pad_token: self.pad_token.map_or(0, |t| t as i64),
        })
    }

    /// The token source these options name (`source=megatron:…`, `tokens:…` or `parquet:…`;
    /// not a blend), opened: what `stoker pack` writes as a flat token file. `seq_len` defaults
    /// to 1 here, since no sample is cut.
    pub fn open_token_source(&self) -> Result<TokenSource> {
        let spec = self.open_token_spec()?;
        let mut options = self.clone();
        options.seq_len = options.seq_len.or(Some(1));
        TokenSource::open_with(&spec, &options.token_config()?, &self.tar_config().remote)
    }

    /// The token keys name their option when set for a source that is not a token stream.
    fn check_no_token_keys(&self) -> Result<()> {
        for (key, set) in [
            ("seq_len", self.seq_len.is_some()),
            ("global_batch_size", self.global_batch_size.is_some()),
            (
                "document_boundaries",
                self.document_boundaries != Boundaries::Ignore,
            ),
            ("token_output_dtype", self.token_output_dtype != DType::I64),
            ("token_dtype", self.token_dtype.is_some()),
            ("eos_token", self.eos_token.is_some()),
            ("vocab_size", self.vocab_size.is_some()),
            ("tokenizer", self.tokenizer.is_some()),
            ("text_column", self.text_column != "text"),
            ("token_packing", self.token_packing != Packing::Concat),
            ("pad_token", self.pad_token.is_some()),
            ("allow_config_change", self.allow_config_change),
        ] {
            if set {
                return Err(Error::option(
                    key,
                    "applies to token sources only (megatron:PREFIX, tokens:PATTERN, parquet:PATTERN \
                     with tokenizer)",
                ));
            }
        }
        Ok(())
    }

    /// How ragged fields are batched: flat under `ragged=offsets`; else padded with `pad`, or
    /// for a token stream `seq_len`, which pads `cu_seqlens` with empty documents at the
    /// window's end.
    pub(crate) fn ragged_fields(&self) -> Ragged {
        match (self.ragged, self.pad, self.is_token_stream(), self.seq_len) {
            (RaggedLayout::Offsets, ..) => Ragged::Offsets,
            (RaggedLayout::Pad, None, true, Some(seq)) => Ragged::Pad(Some(seq as f64)),
            (RaggedLayout::Pad, pad, _, _) => Ragged::Pad(pad),
        }
    }

    /// Whether a callback or tar `npy` field may vary in its leading dimension (become ragged):
    /// when `pad` or `ragged=offsets` says how to batch it.
    fn ragged_allowed(&self) -> bool {
        self.pad.is_some() || self.ragged == RaggedLayout::Offsets
    }

    /// Keys that choose a sampler have no meaning for a stream, which is read in order.
    fn check_stream_keys(&self, iterable: bool) -> Result<()> {
        for (key, set) in [
            ("weights", self.weights.is_some()),
            ("subset", self.subset.is_some()),
            ("replacement", self.replacement),
            ("sampler", self.sampler.is_some()),
            ("num_samples", self.num_samples.is_some() && !iterable),
            ("order", self.order != Order::Random),
        ] {
            if set {
                return Err(Error::option(
                    key,
                    if iterable {
                        "does not apply to an iterable source, which is read in order".to_owned()
                    } else {
                        "applies to indexed tar shards (shuffle_buffer=0) only: streaming reads shards in order".to_owned()
                    },
                ));
            }
        }
        Ok(())
    }

    /// The shuffle buffer of a streaming loader.
    pub fn shuffle_buffer(&self) -> usize {
        self.shuffle_buffer
    }
}

impl LoaderOptions {
    /// What the fields of a callback or iterable source may be: ragged under `pad`, and
    /// image-shaped uint8 tensors (with the mask of `fields(mask=)`) of varying size when the
    /// transform fixes the output size (a pipeline for encoded images, whose size varies too,
    /// can be built).
    fn field_rules(&self) -> FieldRules {
        // A bad spec is reported when the loader builds its pipelines; here it only names no
        // fields.
        let roles = self
            .transform
            .as_deref()
            .and_then(|spec| roles(spec).ok().flatten());
        let image = roles.as_ref().and_then(|r| r.image.clone());
        let mask = roles.as_ref().and_then(|r| r.mask.clone());
        let fixed = roles
            .map(|r| r.image.into_iter().chain(r.mask).collect())
            .unwrap_or_default();
        FieldRules {
            pad: self.ragged_allowed(),
            input_layout: self.input_layout,
            images_vary: self.transform.is_some()
                && Pipeline::new(self.transform.as_deref(), self.dtype, self.image_layout())
                    .is_ok(),
            fixed,
            image,
            mask,
        }
    }

    /// The image batch layout: NCHW unless `layout` says otherwise.
    pub(crate) fn image_layout(&self) -> Layout {
        self.layout.unwrap_or(Layout::Nchw)
    }

    /// The image stages (decode limits and transform) for a source of `fields`: `None` for a
    /// source with no encoded-image field, where `transform`, `dtype` and `layout` are errors.
    pub fn image_stages(&self, fields: &[FieldSpec]) -> Result<Option<ImageStages>> {
        let options = self;
        let has_images = fields.iter().any(|f| f.kind == FieldKind::EncodedImage);
        let roles = match options.transform.as_deref() {
            Some(spec) => roles_with(spec, options.box_format)
                .map_err(|reason| Error::option("transform", reason))?,
            None => None,
        };
        let tensor_images = fields
            .iter()
            .filter(|f| {
                tensor_image_dims(f, options.input_layout).is_some()
                    || roles
                        .as_ref()
                        .is_some_and(|r| r.mask.as_ref() == Some(&f.name))
            })
            .count();
        let wants_pixels =
            options.transform.is_some() || options.dtype.is_some() || options.layout.is_some();
        if !has_images && (tensor_images == 0 || !wants_pixels) {
            // Tensors are delivered as stored unless an image-shaped uint8 field is asked to be
            // transformed: a conversion here would be a second copy a caller should see.
            for (key, set) in [
                ("transform", options.transform.is_some()),
                ("dtype", options.dtype.is_some()),
                ("layout", options.layout.is_some()),
            ] {
                if set {
                    return Err(Error::option(
                        key,
                        "applies to images: encoded image fields, or image-shaped uint8 tensor \
                         fields (uint16, float16, bfloat16 and float32 too) of shape [H, W, C] or \
                         [C, H, W] (set input_layout=hwc or chw unless C is 1, 3 or 4); this \
                         source has none",
                    ));
                }
            }
            return Ok(None);
        }
        if let Some(dtype @ (DType::I32 | DType::I64)) = options.dtype {
            return Err(Error::option(
                "dtype",
                format!("images can be uint8, uint16, float32, float16 or bfloat16, not {dtype}"),
            ));
        }
        // Encoded images vary in size, so their pipeline must fix it; image-shaped tensors get a
        // pipeline each, built by collate for their known size (which checks the spec too).
        let pipeline = if has_images {
            let p = Pipeline::new(
                options.transform.as_deref(),
                options.dtype,
                options.image_layout(),
            )
            .map_err(|reason| Error::option("transform", reason))?;
            Some(Arc::new(p))
        } else {
            None
        };
        let jpeg_decoder = match options.jpeg_decoder {
            Some(d) => d,
            // The environment picks the decoder of every loader that does not say, so a test
            // suite or a job can run on the other decoder unchanged.
            None => match std::env::var("STOKER_JPEG_DECODER") {
                Ok(v) => JpegDecoder::parse(&v).map_err(|reason| {
                    Error::option(
                        "jpeg_decoder",
                        format!("from STOKER_JPEG_DECODER: {reason}"),
                    )
                })?,
                Err(_) => JpegDecoder::Auto,
            },
        };
        Ok(Some(ImageStages {
            max_pixels: options.max_image_pixels,
            jpeg_decoder,
            input_layout: options.input_layout,
            pipeline,
            transform: options.transform.clone(),
            dtype: options.dtype,
            layout: options.image_layout(),
            roles,
        }))
    }
}
