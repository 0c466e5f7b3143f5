"""Member heartbeats over HTTP, in one room: the same answer whichever path a request takes.

* `routes`: `POST /v1/heartbeat` and `POST /v1/heartbeats` as Quart routes, and
  `HeartbeatAnswers`, the one object that decides an answer (authorization on the body's
  stream, rate limits, quotas, the group's actor) for both paths;
* `fast_path`: the same two requests answered below Quart, as ASGI middleware in front of it
  (`rsc.http.app.CoordinatorApp.front`), refusals answered by `rsc.http.answers` as Quart's
  error handlers answer them;
* `steady`: a steady member's unchanged answer rendered once and repeated;
* `held`: answers held open (long polls) until something the member waits for changes.
"""
