"""The app layer, above the library: what a person sees (views: rich tables, verdicts and progress bars), the
main job (pipeline: `hubgym demo`, stage by stage) and its build-and-check step of one env (env_check). The
`hubgym` command (hubgym.cli) is built on these; nothing in the library imports them.
"""
