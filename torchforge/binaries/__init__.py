"""The binaries stage: official PyTorch wheels (torch, torchvision, torchaudio, triton and the NVIDIA
component wheels they require) turned into one consistent conda stack, fetched from an index, and an installed
environment verified. `torchforge repack` and `torchforge verify` are its commands.

- catalog: what torchforge knows about those wheels (torchforge/data/binaries.toml), loaded once;
- wheels: what one wheel is (project, version, CUDA, Python, requirements);
- plan: the consistency checks and the conda package each wheel becomes (name, build string, depends);
- stack: the sequence: check, build every package, publish;
- fetch: `pip download` of a stack with hashes and reuse;
- verify: an installed environment checked from the inside.
"""
