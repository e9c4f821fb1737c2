"""The pipeline core: stage logic, chunking, runner contracts and the local driver (Ray-free).

One stage logic per stage (``thinker.py``, ``talker.py``, ``code2wav.py``, the disaggregated
thinker's in ``kv.py``) owns a runner (``contracts.py`` says what it must offer) and turns its
step output into ``Emit``s (``emit.py``), chunked by delivery mode (``chunking.py``). Two shells
step the same logic: ``LocalPipeline`` (``local.py``: offline ``Omni``, fast tests) and the Serve
engine actor (``stages/engine.py``). ``build.py`` builds runners and logics for both.

Nothing here imports Ray. torch is imported by the payload structs and the chunkers (codec chunks
are tensors); no model code is imported until ``build.py`` loads a stage.
"""
