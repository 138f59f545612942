# The bash runner of lockbox code contexts (embedded in the agent, run as `bash -c`).
# Requests on fd 4: "<length>\n<code>" (length in bytes), after "env <count>\n" and count
# "<length>\nNAME=VALUE" for a run's own variables (exported for the run, given their earlier
# values back after it). Events on fd 3: "<length>\n<json>":
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
  # The run's own variables: each one's name, whether it was set (and exported), and its
  # value before, given back once the run ends.
  __lockbox_saved=()
  if [ "${__lockbox_len#env }" != "$__lockbox_len" ]; then
    __lockbox_n=${__lockbox_len#env }
    while [ "$__lockbox_n" -gt 0 ]; do
      LC_ALL=C IFS= read -r -u "$__lockbox_req" __lockbox_elen || break 2
      LC_ALL=C IFS= read -r -d '' -N "$__lockbox_elen" -u "$__lockbox_req" __lockbox_entry || break 2
      __lockbox_name=${__lockbox_entry%%=*}
      if [[ -v $__lockbox_name ]]; then
        __lockbox_saved+=("$__lockbox_name" "set${!__lockbox_name@a}" "${!__lockbox_name}")
      else
        __lockbox_saved+=("$__lockbox_name" unset "")
      fi
      export "$__lockbox_entry"
      __lockbox_n=$((__lockbox_n - 1))
    done
    __lockbox_entry=
    LC_ALL=C IFS= read -r -u "$__lockbox_req" __lockbox_len || break
  fi
  __lockbox_code=
  if [ "$__lockbox_len" -gt 0 ]; then
    LC_ALL=C IFS= read -r -d '' -N "$__lockbox_len" -u "$__lockbox_req" __lockbox_code || true
  fi
  __lockbox_int=0
  eval "$__lockbox_code"
  __lockbox_rc=$?
  # Backwards, so that a name given twice gets its value from before the run.
  __lockbox_i=${#__lockbox_saved[@]}
  while [ "$__lockbox_i" -gt 0 ]; do
    __lockbox_i=$((__lockbox_i - 3))
    __lockbox_name=${__lockbox_saved[__lockbox_i]}
    case ${__lockbox_saved[__lockbox_i + 1]} in
      unset) unset "$__lockbox_name" ;;
      *x*) export "$__lockbox_name=${__lockbox_saved[__lockbox_i + 2]}" ;;
      *) printf -v "$__lockbox_name" %s "${__lockbox_saved[__lockbox_i + 2]}"; export -n "$__lockbox_name" ;;
    esac
  done
  __lockbox_saved=()
  if [ "$__lockbox_int" = 1 ]; then
    __lockbox_msg="{\"done\":{\"exit_code\":130,\"interrupted\":true}}"
  else
    __lockbox_msg="{\"done\":{\"exit_code\":$__lockbox_rc,\"interrupted\":false}}"
  fi
  printf '%d\n%s' "${#__lockbox_msg}" "$__lockbox_msg" >&"$__lockbox_ev"
done
