"""`pipeplan demo`: its flags (demo_cmd), its run (demo_run: the steps in order and the report), the steps on real
models (demo_steps) and the manifest of the files it wrote (demo_manifest)."""
