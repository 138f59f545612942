# The bash runner of lockbox code contexts (embedded in the agent, run as `bash -c`).
# Requests on fd 4: "<length>\n<code>" (length in bytes). Events on fd 3: "<length>\n<json>":
# {"done": {"exit_code": N}} after each run. The code runs in this shell (eval), so its
# working directory, variables and functions stay for the next run.
exec {__lockbox_req}<&4 {__lockbox_ev}>&3 3>&- 4>&- </dev/null
__lockbox_int=0
trap '__lockbox_int=1' INT
while :; do
  LC_ALL=C IFS= read -r -u "$__lockbox_req" __lockbox_len
  __lockbox_rc=$?
  # A SIGINT that came after the last run ended interrupts the wait for the next: wait again
  # (nothing was sent yet). End of file or an error ends the runner.
  [ "$__lockbox_rc" -gt 128 ] && continue
  [ "$__lockbox_rc" = 0 ] || break
  __lockbox_code=
  if [ "$__lockbox_len" -gt 0 ]; then
    LC_ALL=C IFS= read -r -d '' -N "$__lockbox_len" -u "$__lockbox_req" __lockbox_code || true
  fi
  __lockbox_int=0
  eval "$__lockbox_code"
  __lockbox_rc=$?
  if [ "$__lockbox_int" = 1 ]; then
    __lockbox_msg="{\"done\":{\"exit_code\":130,\"interrupted\":true}}"
  else
    __lockbox_msg="{\"done\":{\"exit_code\":$__lockbox_rc,\"interrupted\":false}}"
  fi
  printf '%d\n%s' "${#__lockbox_msg}" "$__lockbox_msg" >&"$__lockbox_ev"
done
