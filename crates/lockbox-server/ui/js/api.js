// The server's API with the console's session cookie: `X-CSRF-Token` (from the
// `lockbox_csrf` cookie) on every state-changing call; errors become ApiError with the
// server's {code, message, details} in words.

export class ApiError extends Error {
  constructor(status, body, path) {
    const message = body && body.message ? body.message : `the server answered ${status} for ${path}`;
    super(message);
    this.status = status;
    this.code = body && body.code ? body.code : `HTTP_${status}`;
    this.details = body && body.details ? body.details : null;
    this.title = titleFor(status, this.code);
  }
}

function titleFor(status, code) {
  if (status === 401) return "Not logged in";
  if (status === 403) return "Refused";
  if (status === 404) return "Not found";
  if (status === 409) return "Conflict";
  if (status === 0) return "The server cannot be reached";
  return `Error (${code})`;
}

let onUnauthorized = () => {};

/** Called whenever the server answers 401 (the session expired or was never there). */
export function setUnauthorizedHandler(f) {
  onUnauthorized = f;
}

export function csrfToken() {
  for (const part of document.cookie.split(";")) {
    const [k, ...v] = part.trim().split("=");
    if (k === "lockbox_csrf") return decodeURIComponent(v.join("="));
  }
  return "";
}

/** Call the API: api("GET", "/v1/branches"), api("POST", path, body). */
export async function api(method, path, body) {
  const headers = { Accept: "application/json" };
  if (method !== "GET" && method !== "HEAD") headers["X-CSRF-Token"] = csrfToken();
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let reply;
  try {
    reply = await fetch(path, {
      method,
      credentials: "same-origin",
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (e) {
    throw new ApiError(0, { code: "NETWORK", message: `the server cannot be reached (${e.message})` }, path);
  }
  let data = null;
  const text = await reply.text();
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = { message: text };
    }
  }
  if (!reply.ok) {
    if (reply.status === 401 && !path.startsWith("/ui/login")) onUnauthorized();
    throw new ApiError(reply.status, data, path);
  }
  return data;
}

export const get = (path) => api("GET", path);
export const post = (path, body) => api("POST", path, body === undefined ? {} : body);

/** Path segment. */
export const seg = (s) => encodeURIComponent(s);
