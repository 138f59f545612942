// The console's entry: login, the nav, hash routing (#/sandboxes, #/branches/ID, ...).

import { api, get, setUnauthorizedHandler } from "./api.js";
import { fill, errorBox } from "./dom.js";
import { sandboxList, sandboxPage, terminalPage, logsPage } from "./sandboxes.js";
import { branchList, branchPage } from "./branches.js";
import { txnList, txnPage } from "./transactions.js";
import { journalList, journalPage } from "./journal.js";

const routes = [
  [/^\/sandboxes$/, sandboxList, "sandboxes"],
  [/^\/sandboxes\/([^/]+)$/, sandboxPage, "sandboxes"],
  [/^\/sandboxes\/([^/]+)\/terminal\/([^/]+)$/, terminalPage, "sandboxes"],
  [/^\/sandboxes\/([^/]+)\/logs\/([^/]+)$/, logsPage, "sandboxes"],
  [/^\/branches$/, branchList, "branches"],
  [/^\/branches\/([^/]+)$/, branchPage, "branches"],
  [/^\/transactions$/, txnList, "transactions"],
  [/^\/transactions\/([^/]+)$/, txnPage, "transactions"],
  [/^\/journal$/, journalList, "journal"],
  [/^\/journal\/([^/]+)$/, journalPage, "journal"],
];

const view = document.getElementById("view");
const nav = document.getElementById("nav");
const loginPage = document.getElementById("login-page");
let cleanup = null;
let loggedIn = false;
let generation = 0;

function showLogin(message) {
  loggedIn = false;
  if (cleanup) cleanup();
  cleanup = null;
  nav.hidden = true;
  view.replaceChildren();
  loginPage.hidden = false;
  document.getElementById("login-message").textContent = message || "";
  document.title = "Log in · lockbox console";
  document.getElementById("token").focus();
}

async function route() {
  if (!loggedIn) return;
  if (cleanup) cleanup();
  cleanup = null;
  const hash = location.hash.replace(/^#/, "") || "/sandboxes";
  for (const [re, render, section] of routes) {
    const m = hash.match(re);
    if (!m) continue;
    for (const a of nav.querySelectorAll("a")) {
      a.classList.toggle("current", a.dataset.section === section);
    }
    const mine = ++generation;
    view.replaceChildren();
    try {
      const params = m.slice(1).map(decodeURIComponent);
      const done = await render(view, ...params);
      if (mine !== generation) {
        if (typeof done === "function") done();
      } else if (typeof done === "function") {
        cleanup = done;
      }
    } catch (err) {
      if (mine === generation && !(err && err.status === 401)) fill(view, errorBox(err));
    }
    return;
  }
  location.hash = "#/sandboxes";
}

function enter() {
  loggedIn = true;
  loginPage.hidden = true;
  nav.hidden = false;
  route();
}

setUnauthorizedHandler(() => showLogin(loggedIn ? "The session ended: log in again." : ""));

document.getElementById("login-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const input = document.getElementById("token");
  const message = document.getElementById("login-message");
  const token = input.value.trim();
  if (!token) {
    message.textContent = "Enter the server's token.";
    return;
  }
  message.textContent = "Logging in…";
  try {
    await api("POST", "/ui/login", { token });
    input.value = "";
    message.textContent = "";
    enter();
  } catch (err) {
    message.textContent =
      err.status === 401 ? "Wrong token: it does not match the server's token." : `Could not log in: ${err.message}`;
  }
});

document.getElementById("logout").addEventListener("click", async () => {
  try {
    await api("POST", "/ui/logout");
  } finally {
    showLogin("Logged out.");
  }
});

window.addEventListener("hashchange", route);

// No separate session check before the first page: its own API call answers 401 when
// there is no session, and the login form shows then (one round trip less per load).
if (document.cookie.includes("lockbox_csrf=")) {
  enter();
} else {
  get("/ui/session").then(enter, (err) => showLogin(err.status === 401 ? "" : err.message));
}
