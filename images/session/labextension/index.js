// budgethub-lab: what the session's agent tells the open JupyterLab
// (budgethub_session/labnotice.py). It long-polls budgethub-agent/lab; on a
// "preempting" notice it shows the notice, saves every open document with unsaved
// changes and tells the agent what it saved and what it could not; on a "restored"
// notice it shows what came back (once per snapshot), with the lists in a dialog.
import { Dialog, Notification, showDialog } from '@jupyterlab/apputils';
import { URLExt } from '@jupyterlab/coreutils';
import { IDocumentManager } from '@jupyterlab/docmanager';
import { ServerConnection } from '@jupyterlab/services';
import { Widget } from '@lumino/widgets';

const ROUTE = 'budgethub-agent/lab';
const SEEN = 'budgethub-lab:restored:';

function sleep(ms) {
  return new Promise(resolve => setTimeout(resolve, ms));
}

async function request(settings, method, query, body) {
  const url = URLExt.join(settings.baseUrl, ROUTE) + (query || '');
  const init = { method, cache: 'no-store' };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers = { 'Content-Type': 'application/json' };
  }
  const response = await ServerConnection.makeRequest(url, init, settings);
  if (!response.ok) {
    throw new Error(`${method} ${ROUTE}: ${response.status}`);
  }
  return response.status === 204 ? null : response.json();
}

// Every open document with unsaved changes, saved; what could not be, with why.
async function saveAll(app, docManager) {
  const saved = [];
  const failed = {};
  const seen = new Set();
  for (const widget of Array.from(app.shell.widgets('main'))) {
    const context = docManager.contextForWidget(widget);
    if (!context || seen.has(context.path)) {
      continue;
    }
    seen.add(context.path);
    if (!context.model || !context.model.dirty) {
      continue;
    }
    if (context.contentsModel && context.contentsModel.writable === false) {
      failed[context.path] = 'the file is read-only';
      continue;
    }
    try {
      await context.save();
      saved.push(context.path);
    } catch (error) {
      failed[context.path] = String((error && error.message) || error);
    }
  }
  return { saved, failed };
}

function details(title, notice) {
  const body = document.createElement('div');
  body.className = 'budgethub-lab-details';
  for (const [heading, lines] of [
    ['Came back', notice.back || []],
    ['Not kept', notice.lost || []]
  ]) {
    if (!lines.length) {
      continue;
    }
    const h = document.createElement('h4');
    h.textContent = heading;
    const list = document.createElement('ul');
    for (const line of lines) {
      const item = document.createElement('li');
      item.textContent = line;
      list.appendChild(item);
    }
    body.append(h, list);
  }
  return showDialog({ title, body: new Widget({ node: body }), buttons: [Dialog.okButton()] });
}

async function preempting(app, docManager, settings, client, notice) {
  Notification.warning(notice.message, { autoClose: false });
  const result = await saveAll(app, docManager);
  await request(settings, 'POST', '', { client, seq: notice.seq, ...result });
  const failed = Object.keys(result.failed);
  if (result.saved.length) {
    Notification.info(`Saved your unsaved edits: ${result.saved.join(', ')}`, {
      autoClose: false
    });
  }
  if (failed.length) {
    Notification.error(`Could not save: ${failed.join(', ')}`, {
      autoClose: false
    });
  }
}

function restored(notice) {
  const key = SEEN + notice.key;
  try {
    if (window.localStorage.getItem(key)) {
      return;
    }
    window.localStorage.setItem(key, '1');
  } catch (error) {
    // no storage: shown on every load
  }
  const show = notice.lost && notice.lost.length ? Notification.warning : Notification.info;
  show(notice.message, {
    autoClose: false,
    actions: [
      {
        label: 'Details',
        callback: () => void details('Restored from the snapshot', notice)
      }
    ]
  });
}

async function listen(app, docManager) {
  const settings = ServerConnection.makeSettings();
  const client = `lab-${Math.random().toString(36).slice(2, 12)}`;
  let after = 0;
  let instance = null;
  let wait = 0; // the first poll only says that this lab is open
  for (;;) {
    let answer;
    try {
      answer = await request(settings, 'GET', `?client=${client}&after=${after}&wait=${wait}`);
    } catch (error) {
      await sleep(5000); // the server is away (stopped, restarting): try again
      continue;
    }
    wait = 25;
    if (instance !== answer.instance) {
      // A new server (after a restore): its notices start again at 1.
      const fresh = instance !== null && after > 0;
      instance = answer.instance;
      if (fresh) {
        after = 0;
        continue;
      }
    }
    after = answer.seq;
    for (const notice of answer.notices) {
      try {
        if (notice.kind === 'preempting') {
          await preempting(app, docManager, settings, client, notice);
        } else if (notice.kind === 'restored') {
          restored(notice);
        }
      } catch (error) {
        console.warn('budgethub-lab:', error);
      }
    }
  }
}

const plugin = {
  id: 'budgethub-lab:plugin',
  description: 'budgethub: notices before a preemption and after a restore',
  autoStart: true,
  requires: [IDocumentManager],
  activate: (app, docManager) => {
    void app.restored.then(() => listen(app, docManager));
  }
};

export default plugin;
