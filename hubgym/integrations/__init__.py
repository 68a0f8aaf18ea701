"""hubgym envs and runs in the frameworks people already use: TRL (`hubgym.integrations.trl`) and verifiers
(`hubgym.integrations.verifiers_env` runs where verifiers is installed; `hubgym.integrations.verifiers_import`
reads what it wrote and needs no verifiers at all).

Each module imports its framework when used, so `import hubgym` stays light and a missing extra is one line
that names the install command.
"""
