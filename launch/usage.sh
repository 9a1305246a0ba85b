# shellcheck shell=bash
# Sourced by the launch scripts: usage text from the calling script's own header comment.

usage() {  # prints the calling script's header comment (from line 2 to the first non-comment)
  local line
  while IFS= read -r line; do
    [[ $line == '#!'* || $line == '# shellcheck '* ]] && continue
    [[ $line == '#'* ]] || break
    line="${line#\#}"
    printf '%s\n' "${line# }"
  done < "$0"
}

usage_error() {  # usage_error MESSAGE: the message, the usage, exit 2
  printf 'error: %s\n\n' "$*" >&2
  usage >&2
  exit 2
}
