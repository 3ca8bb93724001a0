"""The execution wing: everything that runs one prepared execution.

`request` (what is run: the request, its prepared form, what `on_started` sees), `hooks` (the
host's hooks into a run, one value), `drive` (what every drive of a job shares), `single_use`
(a fresh single-use sandbox, run to its end), `cell` (a session's sandbox and its cells),
`place` (which of the two a run takes its sandbox from and drives its job in),
`evidence` (the rules that turn what was observed into violations, as pure functions),
`assemble` (the result: status precedence, error classification), `broker` (tool-call policy
and dispatch) and `outputs` (the files a script leaves). `sandbox.engine` is the façade over
it. The package re-exports nothing: its modules are imported by name.
"""

__all__: list[str] = []
